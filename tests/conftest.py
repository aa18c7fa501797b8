"""Shared fixtures (the bounded wait helper is `node.swarm.wait_until`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def key_path(tmp_path: Path) -> Iterator[Path]:
    """A path where a test may create an identity."""
    yield tmp_path / "identity.key"
