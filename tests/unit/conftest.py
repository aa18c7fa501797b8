"""The unit tier: every test here is guarded by `tests.helpers.isolation` (no socket, no process,
no sleep); one that reaches for any of them fails, naming what it did."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.isolation import IsolationGuard, events_of, guard_phase

_guard = IsolationGuard.install(raise_on_violation=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from guard_phase(_guard, item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from guard_phase(_guard, item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from guard_phase(_guard, item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    events = events_of(item, call.when)
    if events and not report.failed:
        report.outcome = "failed"
        report.longrepr = (  # the test itself may have caught the IsolationViolation
            f"a unit test may open no socket, start no process and never sleep; this one did: {events}. "
            "Move it to tests/integration, or give the code under test a fake clock or transport."
        )
