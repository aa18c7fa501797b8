"""A standalone validator's forward queue: durable, retried with a doubling back-off, bounded, and a
group no trainer took before its envelope expired is dropped and counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.rollouts.forward_queue import ForwardQueue


class Trainers:
    """A `send` that fails while `busy`, and records what it was handed and when."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.busy = True
        self.attempts: list[tuple[float, bytes]] = []
        self.taken: list[tuple[bytes, list[bytes]]] = []

    async def __call__(self, group: bytes, verdicts: list[bytes]) -> bool:
        self.attempts.append((self.clock[0], group))
        if self.busy:
            return False
        self.taken.append((group, verdicts))
        return True


def _queue(path: Path | None, trainers: Trainers, clock: list[float], **kwargs: object) -> ForwardQueue:
    return ForwardQueue(path, send=trainers, clock=lambda: clock[0], **kwargs)  # type: ignore[arg-type]


def test_a_group_no_trainer_takes_is_retried_with_a_doubling_back_off() -> None:
    clock = [1000.0]
    trainers = Trainers(clock)
    queue = _queue(None, trainers, clock, base_backoff_s=1.0, max_backoff_s=4.0)
    queue.put(b"group", [b"v1", b"", b"v3"], expires_at=2000.0)

    async def steps() -> list[float | None]:
        due = []
        for _ in range(5):
            next_at = await queue.drain_due()
            due.append(next_at)
            clock[0] = next_at if next_at is not None else clock[0]
        return due

    due = asyncio.run(steps())
    assert [d - 1000.0 for d in due if d is not None][:4] == [1.0, 3.0, 7.0, 11.0]  # 1, 2, 4, 4 (capped)
    assert len(trainers.attempts) == 5 and queue.retries == 5 and len(queue) == 1

    trainers.busy = False
    assert asyncio.run(queue.drain_due()) is None
    assert trainers.taken == [(b"group", [b"v1", b"", b"v3"])]  # verdicts come back whole, empty ones too
    assert queue.forwarded == 1 and len(queue) == 0


def test_queued_groups_survive_a_restart(tmp_path: Path) -> None:
    clock = [0.0]
    trainers = Trainers(clock)
    first = _queue(tmp_path / "forwards.db", trainers, clock)
    first.put(b"a", [b"x"], expires_at=100.0)
    first.put(b"b", [b"y"], expires_at=100.0)
    asyncio.run(first.stop())

    trainers.busy = False
    again = _queue(tmp_path / "forwards.db", trainers, clock)
    assert len(again) == 2
    asyncio.run(again.drain_due())
    assert [group for group, _ in trainers.taken] == [b"a", b"b"]


def test_an_expired_group_is_dropped_and_counted() -> None:
    clock = [0.0]
    trainers = Trainers(clock)
    queue = _queue(None, trainers, clock)
    queue.put(b"late", [b"x"], expires_at=10.0)
    queue.put(b"fresh", [b"y"], expires_at=1000.0)
    clock[0] = 10.0
    trainers.busy = False
    asyncio.run(queue.drain_due())
    assert [group for group, _ in trainers.taken] == [b"fresh"] and queue.expired == 1


def test_the_queue_is_bounded() -> None:
    clock = [0.0]
    queue = _queue(None, Trainers(clock), clock, max_groups=2)
    queue.put(b"a", [], expires_at=10.0)
    assert not queue.full()
    queue.put(b"b", [], expires_at=10.0)
    assert queue.full()
    with pytest.raises(ValueError):
        _queue(None, Trainers(clock), clock, max_groups=0)


def test_the_running_queue_forwards_what_is_put_without_waiting_for_a_timer() -> None:
    clock = [0.0]
    trainers = Trainers(clock)
    trainers.busy = False

    async def main() -> None:
        took = asyncio.Event()
        send = trainers.__call__

        async def sending(group: bytes, verdicts: list[bytes]) -> bool:
            taken = await send(group, verdicts)
            took.set()
            return taken

        queue = ForwardQueue(None, send=sending, clock=lambda: clock[0])
        await queue.start()
        try:
            await asyncio.to_thread(queue.put, b"g", [b"v"], 100.0)
            await asyncio.wait_for(took.wait(), 30.0)  # the put wakes the drain: no timer is due
            assert trainers.taken == [(b"g", [b"v"])]
        finally:
            await queue.stop()

    asyncio.run(main())
