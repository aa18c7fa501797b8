"""The suite's own tools: the CI skip policy, the unit tier's isolation guard and the virtual clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers.isolation import IsolationGuard, IsolationViolation
from tests.helpers.suite_policy import refused_skip
from tests.helpers.virtual_time import VirtualClockLoop

CI = {"CI": "true"}


def test_a_skip_for_a_missing_tool_fails_under_ci_only() -> None:
    reason = "Skipped: needs Debian's chromium (apt-get install -y chromium)"
    refusal = refused_skip(reason, CI)
    assert refusal is not None and "skipped under CI=true" in refusal and "chromium" in refusal
    assert refused_skip(reason, {}) is None
    assert refused_skip(reason, {"CI": "false"}) is None


def test_a_skip_for_what_no_ci_machine_has_stands_under_ci() -> None:
    assert refused_skip("Skipped: needs a CUDA GPU (torch.cuda.is_available() is False)", CI) is None


@pytest.mark.parametrize(
    ("event", "args", "named"),
    [
        ("socket.connect", (object(), ("127.0.0.1", 80)), "socket.connect"),
        ("socket.bind", (object(), ("127.0.0.1", 0)), "socket.bind"),
        ("subprocess.Popen", ("/bin/true", ["/bin/true"], None, None), "subprocess.Popen"),
        ("os.fork", (), "os.fork"),
        ("time.sleep", (0.5,), "time.sleep(0.5)"),
    ],
)
def test_the_guard_refuses_sockets_processes_and_sleeps_while_guarding(
    event: str, args: tuple[object, ...], named: str
) -> None:
    guard = IsolationGuard(raise_on_violation=True)  # not installed: its hook is called by hand
    guard._hook(event, args)  # not guarding: ignored
    with guard.guarded() as events, pytest.raises(IsolationViolation, match="tests/integration"):
        guard._hook(event, args)
    assert len(events) == 1 and events[0].startswith(named)


def test_the_guard_sees_a_call_of_time_sleep_itself() -> None:
    guard = IsolationGuard(raise_on_violation=True)
    before = time.sleep
    with guard.guarded() as events, pytest.raises(IsolationViolation):
        time.sleep(0.001)  # refused before it sleeps (and before the unit tier's own guard sees it)
    assert events == ["time.sleep(0.001)"]
    assert time.sleep is before  # put back


def test_the_guard_lets_the_rest_through() -> None:
    guard = IsolationGuard(raise_on_violation=True)
    with guard.guarded() as events:
        guard._hook("time.sleep", (0,))  # a bare yield, not a wait
        guard._hook("socket.__new__", (object(), 1, 1, 0))  # an event loop's self-pipe
        guard._hook("open", ("/tmp/x", "r", 0))
    assert events == []


def test_the_virtual_clock_jumps_to_the_next_timer() -> None:
    async def two_timers() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []
        for delay in (3600.0, 0.25):
            await asyncio.sleep(delay)
            seen.append(loop.time())
        return seen

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        assert runner.run(two_timers()) == [3600.0, 3600.25]
