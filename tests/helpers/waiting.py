"""Bounded waits on a state the code exposes: the suite's only poll loops (no test sleeps on its own).

`node.swarm.wait_until` is the blocking form (from a test's thread); `async_wait_until` yields to
the event loop between polls (from a coroutine on the loop that runs the code under test).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def async_wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> None:
    """Wait (yielding to the event loop) until `predicate()` holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


async def async_wait_for(
    check: Callable[[], Awaitable[bool]], timeout_s: float, interval_s: float = 0.2
) -> None:
    """`async_wait_until` for a check that must itself await (a DHT lookup); fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)
