"""What keeps the unit tier a unit tier: a test there opens no socket, starts no process, never sleeps.

Python's audit hooks (PEP 578) see every `socket.bind`/`socket.connect` and every process start
(`subprocess.Popen`, `os.fork`, `os.posix_spawn`, `os.exec*`, `os.system`), in any thread,
whichever library makes the call; `time.sleep` with a positive duration is seen by its audit
event from Python 3.12 on, and before that by wrapping `time.sleep` while a test is guarded.
`IsolationGuard` records each such event made while a guarded test runs (its setup, call and
teardown, module-scoped fixtures included) and raises `IsolationViolation` at the call site;
the test then fails with the events listed, even where the code under test swallowed the
exception. A local `socketpair` (an event loop's self-pipe) binds nothing and is allowed.

`tests/unit/conftest.py` guards every test under it. Run with `HIVENET_ISOLATION_REPORT=FILE`
(and `-p tests.helpers.isolation`) it instead records, for any tier, which tests would break
the rule, one JSON line per test, without failing them: that is how a test's tier is chosen.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system", "os.spawn"}
)
_SOCKET_EVENTS = frozenset({"socket.bind", "socket.connect"})
_SLEEP_IS_AUDITED = sys.version_info >= (3, 12)
"""`time.sleep` raises an audit event from Python 3.12 on; before, the guard wraps it while guarding."""


class IsolationViolation(RuntimeError):
    """A unit test reached for a socket, a process or the clock."""


class IsolationGuard:
    """One audit hook per process (they cannot be removed); it acts only while a test is guarded."""

    _installed: IsolationGuard | None = None

    def __init__(self, *, raise_on_violation: bool) -> None:
        self.raise_on_violation = raise_on_violation
        self.active = False
        self.events: list[str] = []
        self._lock = threading.Lock()

    @classmethod
    def install(cls, *, raise_on_violation: bool) -> IsolationGuard:
        if cls._installed is None:
            guard = cls(raise_on_violation=raise_on_violation)
            sys.addaudithook(guard._hook)
            cls._installed = guard
        return cls._installed

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event in _SOCKET_EVENTS:
            what = f"{event} {args[1]!r}"
        elif event in _PROCESS_EVENTS:
            what = f"{event} {args[0]!r}" if args else event
        elif event == "time.sleep" and args and args[0] > 0:
            what = f"time.sleep({args[0]})"
        else:
            return
        with self._lock:
            self.events.append(what)
        if self.raise_on_violation:
            raise IsolationViolation(f"a unit test may not call {what}: move the test to tests/integration")

    @contextlib.contextmanager
    def guarded(self) -> Iterator[list[str]]:
        """Guard the block; yields the list that collects its events."""
        with self._lock:
            self.events = []
        self.active = True
        real_sleep = time.sleep
        if not _SLEEP_IS_AUDITED:
            time.sleep = self._sleep_through(real_sleep)  # type: ignore[assignment]
        try:
            yield self.events
        finally:
            time.sleep = real_sleep
            self.active = False

    def _sleep_through(self, real_sleep: Callable[[float], None]) -> Callable[[float], None]:
        def sleep(secs: float) -> None:
            self._hook("time.sleep", (secs,))
            real_sleep(secs)

        return sleep


class GuardedPhases:
    """A plugin object: guards the setup, call and teardown of each item that `applies(item)`, and
    fails such an item whose phase did something (even if the code under test swallowed the
    IsolationViolation); with `report_to`, it instead appends one JSON line per item to that file."""

    def __init__(
        self, guard: IsolationGuard, applies: Callable[[pytest.Item], bool], report_to: Path | None = None
    ) -> None:
        self.guard = guard
        self.applies = applies
        self.report_to = report_to

    def _phase(self, item: pytest.Item, when: str) -> Iterator[None]:
        if not self.applies(item):
            yield
            return
        with self.guard.guarded() as events:
            yield
        item.stash.setdefault(_EVENTS, {})[when] = list(events)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase(item, "teardown")
        if self.report_to is not None and self.applies(item):
            kinds = sorted({e.split(" ")[0].split("(")[0] for e in events_of(item)})
            with self.report_to.open("a") as report:
                report.write(json.dumps({"test": item.nodeid, "events": kinds}) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
        events = events_of(item, call.when)
        if self.report_to is None and events and not report.failed:
            report.outcome = "failed"
            report.longrepr = (
                f"a unit test may open no socket, start no process and never sleep; this one did: {events}. "
                "Move it to tests/integration, or give the code under test a fake clock or transport."
            )


_EVENTS = pytest.StashKey[dict[str, list[str]]]()


def events_of(item: pytest.Item, when: str | None = None) -> list[str]:
    """What `item` did in phase `when`, or in all its phases."""
    phases = item.stash.get(_EVENTS, {})
    if when is not None:
        return phases.get(when, [])
    return [event for events in phases.values() for event in events]


# ---- the reporting plugin (-p tests.helpers.isolation with HIVENET_ISOLATION_REPORT=FILE) ---------


def pytest_configure(config: pytest.Config) -> None:
    report = os.environ.get("HIVENET_ISOLATION_REPORT")
    if report is not None:
        guard = IsolationGuard.install(raise_on_violation=False)
        config.pluginmanager.register(
            GuardedPhases(guard, lambda item: True, Path(report)), "isolation-report"
        )
