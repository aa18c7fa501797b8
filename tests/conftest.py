"""Shared fixtures (the bounded wait helper is `node.swarm.wait_until`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def key_path(tmp_path: Path) -> Iterator[Path]:
    """A path where a test may create an identity."""
    yield tmp_path / "identity.key"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small tensor ops on a shared 2-core machine: one torch thread is fastest and least disruptive."""
    import torch  # only the modules that ask for this fixture pay for importing torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
