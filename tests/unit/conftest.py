"""The unit tier: every test here is guarded by `tests.helpers.isolation` (no socket, no process,
no sleep); one that reaches for any of them fails, naming what it did."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.isolation import GuardedPhases, IsolationGuard

UNIT = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    guard = IsolationGuard.install(raise_on_violation=True)
    config.pluginmanager.register(
        GuardedPhases(guard, lambda item: UNIT in item.path.parents), "unit-isolation"
    )
