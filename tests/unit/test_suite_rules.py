"""The rules the suite holds itself to, checked by reading its source (no test here runs another).

- Every test module lives in a tier: `tests/unit`, `tests/integration` or `tests/e2e`.
- No test waits on the clock: a `time.sleep`/`asyncio.sleep` in `tests/` whose duration is not
  literally 0 (a bare yield to the event loop) must be listed in `SLEEP_ALLOWED`, with the reason
  it cannot wait on a state the code exposes. Polling belongs in `wait_until` and
  `async_wait_until`, which bound every wait with one deadline that fails loudly.
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")

SLEEP_ALLOWED: dict[tuple[str, str], str] = {
    ("helpers/waiting.py", "async_wait_until"): "the suite's poll loop, bounded by one deadline",
    ("helpers/waiting.py", "async_wait_for"): "the poll loop for awaited checks, bounded by one deadline",
    ("unit/node/test_membership_refresh.py", "store"): (
        "a DHT store that takes 0.3 s of the loop's virtual clock: no wall-clock time passes"
    ),
    ("unit/test_suite_tools.py", "two_timers"): (
        "timers on the virtual clock under test: no wall-clock time passes"
    ),
    ("unit/test_suite_tools.py", "test_the_guard_sees_a_call_of_time_sleep_itself"): (
        "the sleep the isolation guard must refuse: it never sleeps"
    ),
    ("helpers/state_flood.py", "_hammer"): (
        "the attacker's own pacing after a request that failed in transport (the victim unreachable "
        "for a moment), not a wait for an effect: the test waits on the flood's counters"
    ),
}
"""(path under tests/, enclosing function) -> why that sleep cannot be a wait on a state."""


def _sleeps(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(enclosing function, line) of every sleep call whose duration is not the literal 0."""
    stack: list[str] = []

    def visit(node: ast.AST) -> Iterator[tuple[str, int]]:
        name = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        if name is not None:
            stack.append(name)
        if isinstance(node, ast.Call) and _is_sleep(node.func) and not _is_zero(node):
            yield (stack[-1] if stack else "<module>"), node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child)
        if name is not None:
            stack.pop()

    yield from visit(tree)


def _is_sleep(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return (
            func.attr == "sleep" and isinstance(func.value, ast.Name) and func.value.id in ("time", "asyncio")
        )
    return isinstance(func, ast.Name) and func.id == "sleep"


def _is_zero(call: ast.Call) -> bool:
    args = [*call.args, *(k.value for k in call.keywords)]
    return len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value == 0


def _parse(path: Path) -> ast.AST:
    # CPython before 3.11.8 keeps the AST constructor's recursion depth in interpreter-wide state
    # (gh-106905): a garbage collection inside the parse runs finalizers, which can let another
    # thread parse too (3.11's tracebacks parse source for their carets), and the parse fails with
    # a false "AST constructor recursion depth mismatch" SystemError (seen here under load). With
    # the collector paused, no Python code runs inside the parse.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        if collecting:
            gc.enable()


def _test_sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_test_module_lives_in_a_tier() -> None:
    strays = [
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in TIERS
    ]
    assert not strays, f"test modules outside tests/{{{','.join(TIERS)}}}: {strays}"


def test_no_test_sleeps_outside_the_allow_list() -> None:
    found: dict[tuple[str, str], list[int]] = {}
    for path in _test_sources():
        relative = path.relative_to(TESTS).as_posix()
        for function, line in _sleeps(_parse(path)):
            found.setdefault((relative, function), []).append(line)
    unlisted = {
        f"{path}:{lines[0]} in {function}()"
        for (path, function), lines in found.items()
        if (path, function) not in SLEEP_ALLOWED
    }
    assert not unlisted, (
        "these tests wait on the clock; wait on a state the code exposes (wait_until) instead, or list "
        f"the sleep in SLEEP_ALLOWED with the reason it must be a sleep: {sorted(unlisted)}"
    )
    stale = set(SLEEP_ALLOWED) - set(found)
    assert not stale, f"SLEEP_ALLOWED lists sleeps that no longer exist: {sorted(stale)}"


def test_the_rule_sees_each_form_of_sleep() -> None:
    source = (
        "import time, asyncio\n"
        "from time import sleep\n"
        "SETTLE_S = 2.0\n"
        "def a():\n    time.sleep(SETTLE_S)\n"
        "async def b():\n    await asyncio.sleep(0.5)\n    await asyncio.sleep(0)\n"
        "def c():\n    sleep(1)\n"
        "def d(x):\n    time.sleep(8 * x)\n"
    )
    assert [f for f, _ in _sleeps(ast.parse(source))] == ["a", "b", "c", "d"]


def test_no_property_test_has_a_wall_clock_deadline() -> None:
    """A hypothesis deadline asserts a wall-clock time, which a loaded machine misses for correct code."""
    from tests.helpers.fuzzing import FAST, SLOW

    assert FAST.deadline is None and SLOW.deadline is None
    timed = [
        f"{path.relative_to(TESTS).as_posix()}:{node.lineno}"
        for path in _test_sources()
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.keyword)
        and node.arg == "deadline"
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
    ]
    assert not timed, f"hypothesis settings with a deadline (use deadline=None): {timed}"
