"""hivemind's cross-process future locks survive a process killed while holding one."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable

import pytest
from hivemind.utils.mpfuture import MPFuture, SharedBytes

import node.dht_node  # noqa: F401  (what starts DHTs installs the robust locks on import)
from node.process_locks import RobustLock

FORK = mp.get_context("fork")


def _hold_forever(lock: object, held: object) -> None:
    with lock:  # type: ignore[attr-defined]
        held.set()  # type: ignore[attr-defined]
        threading.Event().wait()  # never set: holds the lock until the test kills this process


def _killed_while_holding(lock: object) -> None:
    held = FORK.Event()
    holder = FORK.Process(target=_hold_forever, args=(lock, held), daemon=True)
    holder.start()
    assert held.wait(30), "the holder never took the lock"
    holder.kill()
    holder.join(30)


def _answer(future: MPFuture, value: int) -> None:
    future.set_result(value)


@pytest.mark.parametrize(
    "lock",
    [lambda: MPFuture._update_lock, lambda: SharedBytes._lock],
    ids=["update_lock", "shared_bytes_lock"],
)
def test_a_process_killed_holding_a_future_lock_does_not_stop_others_answering(
    lock: Callable[[], object],
) -> None:
    """As a node's averager terminated mid-answer would: afterwards its DHT must still answer calls."""
    _killed_while_holding(lock())
    future: MPFuture = MPFuture()
    answering = FORK.Process(target=_answer, args=(future, 42), daemon=True)
    answering.start()
    try:
        assert future.result(timeout=20) == 42  # hivemind's own semaphores: blocked for good
    finally:
        answering.kill()
        answering.join(10)


def test_the_robust_lock_excludes_other_processes_and_other_threads() -> None:
    lock = RobustLock()
    held = FORK.Event()
    holder = FORK.Process(target=_hold_forever, args=(lock, held), daemon=True)
    holder.start()
    try:
        assert held.wait(30)
        assert not lock.acquire(blocking=False)  # another process holds it
    finally:
        holder.kill()
        holder.join(30)
    assert lock.acquire(blocking=False)  # its holder died: released
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert taken == [False]  # another thread of this process holds it
    lock.release()
    with lock:
        pass
