"""What keeps the unit tier a unit tier: a test there opens no socket, starts no process, never sleeps.

Python's audit hooks (PEP 578) see every `socket.bind`/`socket.connect`, every process start
(`subprocess.Popen`, `os.fork`, `os.posix_spawn`, `os.exec*`, `os.system`) and every
`time.sleep` with a positive duration, in any thread, whichever library makes the call.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system", "os.spawn"}
)
_SOCKET_EVENTS = frozenset({"socket.bind", "socket.connect"})


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
        try:
            yield self.events
        finally:
            self.active = False


def guard_phase(guard: IsolationGuard, item: pytest.Item, when: str) -> Iterator[None]:
    """A hookwrapper body: guard the `when` phase ("setup", "call", "teardown") of `item` and
    remember what it did."""
    with guard.guarded() as events:
        yield
    item.stash.setdefault(_EVENTS, {})[when] = list(events)


_EVENTS = pytest.StashKey[dict[str, list[str]]]()


def events_of(item: pytest.Item, when: str | None = None) -> list[str]:
    """What `item` did in phase `when`, or in all its phases."""
    phases = item.stash.get(_EVENTS, {})
    if when is not None:
        return phases.get(when, [])
    return [event for events in phases.values() for event in events]


# ---- the reporting plugin (-p tests.helpers.isolation with HIVENET_ISOLATION_REPORT=FILE) ---------

_REPORT = os.environ.get("HIVENET_ISOLATION_REPORT")


if _REPORT is not None:
    _report_path = Path(_REPORT)
    _guard = IsolationGuard.install(raise_on_violation=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
        yield from guard_phase(_guard, item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
        yield from guard_phase(_guard, item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
        yield from guard_phase(_guard, item, "teardown")
        kinds = sorted({e.split(" ")[0].split("(")[0] for e in events_of(item)})
        with _report_path.open("a") as report:
            report.write(json.dumps({"test": item.nodeid, "events": kinds}) + "\n")
