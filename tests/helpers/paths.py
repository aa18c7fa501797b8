"""Where the repository and the suite's data files are, for tests in any tier at any depth."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (where `pyproject.toml` is)."""
TEST_DATA = REPO / "tests" / "data"
