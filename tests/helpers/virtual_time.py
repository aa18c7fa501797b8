"""An asyncio event loop on a virtual clock, for tests of code that schedules by the loop's time.

When every task waits on a timer and no I/O is ready, the loop does not sleep: its clock jumps to
the next timer. Rate and timeout logic then runs in microseconds and its timing is exact, so a
test can assert when each thing happened. The code under test must read the time from
`asyncio.get_running_loop().time()` (not `time.monotonic()`), and its I/O must be fakes that
complete through the loop (a real socket or thread keeps running on the wall clock).
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer pending: only real I/O can wake the loop
            return super().select(None)
        self._loop.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """`asyncio.Runner(loop_factory=VirtualClockLoop)` runs a coroutine on virtual time from 0."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now
