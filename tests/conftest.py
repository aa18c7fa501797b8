"""Shared fixtures: temporary identities and a bounded wait helper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node.swarm import wait_until

__all__ = ["wait_until"]


@pytest.fixture
def key_path(tmp_path: Path) -> Iterator[Path]:
    """A path where a test may create an identity."""
    yield tmp_path / "identity.key"
