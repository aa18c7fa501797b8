"""The node runtime: one loop thread, the sync bridge, and service lifecycle."""

from __future__ import annotations

import asyncio
import threading

import pytest

from node.runtime import NodeRuntime, RuntimeStopped, offload


class Recorder:
    def __init__(self, name: str, log: list[str], fail_stop: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_stop = fail_stop
        self.loop_thread: threading.Thread | None = None

    async def start(self) -> None:
        self.loop_thread = threading.current_thread()
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail_stop:
            raise RuntimeError("broken")


@pytest.fixture
def runtime():
    rt = NodeRuntime("test").start()
    yield rt
    rt.close()


def test_call_runs_on_the_loop_thread_and_returns(runtime: NodeRuntime) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert runtime.call(where()) == "test-loop"


def test_call_propagates_exceptions(runtime: NodeRuntime) -> None:
    async def boom() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        runtime.call(boom())


def test_call_timeout_cancels_the_coroutine(runtime: NodeRuntime) -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.Event().wait()  # never set: runs until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        runtime.call(slow(), timeout_s=0.1)
    assert cancelled.wait(5)


def test_offload_runs_blocking_code_off_the_loop(runtime: NodeRuntime) -> None:
    async def body() -> tuple[str, str]:
        name = await offload(lambda: threading.current_thread().name)
        return threading.current_thread().name, name

    loop_name, worker_name = runtime.call(body())
    assert loop_name == "test-loop" and worker_name != "test-loop"


def test_call_from_the_loop_itself_is_refused(runtime: NodeRuntime) -> None:
    async def nested() -> None:
        async def inner() -> None:
            return None

        runtime.call(inner())

    with pytest.raises(RuntimeError, match="await the coroutine"):
        runtime.call(nested())


def test_services_start_in_order_and_stop_in_reverse_even_if_one_fails() -> None:
    log: list[str] = []
    runtime = NodeRuntime("svc").start()
    first = Recorder("a", log, fail_stop=True)
    runtime.add_service(first)
    runtime.add_service(Recorder("b", log))
    assert first.loop_thread is not None and first.loop_thread.name == "svc-loop"
    runtime.close()
    assert log == ["start a", "start b", "stop b", "stop a"]
    assert not runtime.running


def test_a_closed_runtime_refuses_work() -> None:
    runtime = NodeRuntime("closed").start()
    runtime.close()

    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeStopped):
        runtime.call(nothing())


def test_close_cancels_pending_tasks() -> None:
    runtime = NodeRuntime("pending").start()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()  # never set: runs until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise

    runtime.submit(forever())
    runtime.close()
    assert cancelled.is_set()
