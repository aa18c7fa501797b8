"""Shared machinery of the fuzz tests: the two hypothesis profiles and byte-mutation strategies.

Every fuzz property exists twice: a fast variant in the default suite (`FAST_EXAMPLES` cases)
and a `slow`-marked one (`SLOW_EXAMPLES` cases, `pytest -m slow`). Both are derandomized (the
same cases on every run, so CI is reproducible) and keep no example database, so nothing is
written into the repository.

No example has a wall-clock deadline: on a loaded machine one can wait seconds for a core, and a
deadline then fails a correct parser. A hang is what `run_bounded` catches: code that waits on
input it already has (pre-fed, then EOF) waits forever, so its bound only needs to be far above
any scheduling delay, not close to an example's cost.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HOSTILE_TEXT_SAMPLES = (
    "[/bold]",
    "[red]x[/red]",
    "[link=http://x]y",
    "\x1b[31mred",
    "\x1b]8;;http://x\x07click",
    "a\nb",
    "\r\x00",
    "\u202e",
)
"""Text a hostile peer sends to be printed: rich markup, ANSI and OSC escapes, control characters,
a line break, a right-to-left override."""

FAST_EXAMPLES = 50
SLOW_EXAMPLES = 2000
WAIT_S = 60.0
"""Bound on one async handler under fuzz, all its input already fed: only a hang reaches it."""

FAST = settings(
    max_examples=FAST_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(FAST, max_examples=SLOW_EXAMPLES)


def fuzz_variants(
    prop: Callable[..., None], *strategies: st.SearchStrategy[Any]
) -> tuple[Callable[..., None], Callable[..., None]]:
    """(fast test, slow test) of one property; assign both to `test_...` names in a test module."""
    fast = FAST(given(*strategies)(prop))
    slow = pytest.mark.slow(SLOW(given(*strategies)(prop)))
    return fast, slow


EDGE_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])
"""Floats that break naive range checks (every comparison with NaN is False); drawn often on purpose."""


def run_bounded(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on a fresh event loop; a TimeoutError means it hung on its input."""
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


@st.composite
def mutated(draw: st.DrawFn, seed: bytes, max_edits: int = 4) -> bytes:
    """`seed` with a few bytes flipped, cut, inserted or appended: almost-valid messages."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, max_edits))):
        op = draw(st.sampled_from(("flip", "truncate", "insert", "extend", "overwrite")))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            index = min(pos, len(data) - 1)
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "extend":
            data.extend(draw(st.binary(min_size=1, max_size=64)))
        elif op == "overwrite" and data:
            index = min(pos, len(data) - 1)
            data[index] = draw(st.integers(0, 255))
    return bytes(data)


def arbitrary_or_mutated(seed: bytes, max_size: int = 2048) -> st.SearchStrategy[bytes]:
    """Half arbitrary bytes, half mutations of a valid message."""
    return st.one_of(st.binary(max_size=max_size), mutated(seed))
