"""Attacks on the serving side's bitmap watch streams: a few identities holding watches open must
not keep an honest peer from fetching (issue 12, 'watch-slot exhaustion')."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.broadcast.requests import NotHeld, Stream, open_watch
from node.broadcast.watch_slots import WatchSlots
from protocol.manifest import Manifest
from tests.helpers.broadcast import (
    Swarm,
    assert_state_dicts_equal,
    make_state_dict,
    open_swarm,
    start_broadcast,
)
from tests.helpers.waiting import async_wait_until


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"), num_nodes=5)


async def hold_watches(broadcast: object, target: object, manifest: Manifest, count: int) -> list[Stream]:
    """Open `count` watch streams from `broadcast`'s node to `target` and keep them (refused ones are skipped)."""
    streams = []
    for _ in range(count):
        with contextlib.suppress(NotHeld):
            streams.append(await open_watch(broadcast.p2p, target, manifest))  # type: ignore[attr-defined]
    return streams


async def ends(stream: Stream, timeout_s: float = 10.0) -> bool:
    """Whether the server closes `stream` within `timeout_s` (what it sent before is read and skipped)."""
    try:
        await asyncio.wait_for(stream[0].read(), timeout=timeout_s)  # read() returns only at the end
    except TimeoutError:
        return False
    return True


def close_all(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.close()


def test_watches_held_by_two_identities_do_not_block_an_honest_fetch(swarm: Swarm, tmp_path: Path) -> None:
    """The attack of the issue: 16 watches from 2 identities filled the publisher's 16 stream slots
    (shared by every stream kind) and the honest fetch could not even get the manifest."""
    publisher, attacker_a, attacker_b, honest_node = swarm.nodes[1:5]

    async def main() -> None:
        pub = await start_broadcast(
            publisher, tmp_path / "pub", [publisher], max_upload_streams=16, max_upload_streams_per_peer=8
        )
        attackers = [
            await start_broadcast(node, tmp_path / f"a{i}", [publisher], serve=False)
            for i, node in enumerate((attacker_a, attacker_b))
        ]
        honest = await start_broadcast(honest_node, tmp_path / "honest", [publisher])
        held: list[Stream] = []
        try:
            state = make_state_dict(seed=31, total_floats=40_000)
            manifest = await pub.publish("watchslots", 1, state)
            for attacker in attackers:
                held += await hold_watches(attacker, publisher.identity.peer_id, manifest, 8)
            entry = await asyncio.wait_for(honest.fetch("watchslots", manifest_timeout_s=5.0), timeout=60)
            assert entry.complete
            assert_state_dicts_equal(await honest.load("watchslots", 1), state)
        finally:
            close_all(held)
            for b in (pub, *attackers, honest):
                await b.stop()

    asyncio.run(main())


def test_a_full_watch_budget_evicts_the_heaviest_peers_oldest_watch(swarm: Swarm, tmp_path: Path) -> None:
    publisher, attacker_a, attacker_b, honest_node = swarm.nodes[1:5]

    async def main() -> None:
        pub = await start_broadcast(
            publisher, tmp_path / "pub", [publisher], max_watch_streams=4, max_watch_streams_per_peer=2
        )
        attackers = [
            await start_broadcast(node, tmp_path / f"a{i}", [publisher], serve=False)
            for i, node in enumerate((attacker_a, attacker_b))
        ]
        honest = await start_broadcast(honest_node, tmp_path / "honest", [publisher])
        held_a: list[Stream] = []
        held_b: list[Stream] = []
        try:
            manifest = await pub.publish("evict", 1, make_state_dict(seed=32, total_floats=20_000))
            held_a = await hold_watches(attackers[0], publisher.identity.peer_id, manifest, 2)
            held_b = await hold_watches(attackers[1], publisher.identity.peer_id, manifest, 2)
            assert len(held_a) == 2 and len(held_b) == 2 and len(pub.service.watches) == 4
            # a peer at its own cap replaces its own oldest watch, never someone else's
            held_a += await hold_watches(attackers[0], publisher.identity.peer_id, manifest, 1)
            assert len(held_a) == 3
            assert await ends(held_a[0])
            assert not await ends(held_b[0], timeout_s=1.0)
            # the budget is full, yet an honest newcomer gets a slot: it takes the oldest watch of the peers
            # holding most (a and b hold two each; a's second watch is older than both of b's)
            entry = await asyncio.wait_for(honest.fetch("evict", manifest_timeout_s=5.0), timeout=60)
            assert entry.complete
            assert await ends(held_a[1])
            assert pub.service.watches.evictions == 2
        finally:
            close_all(held_a + held_b)
            for b in (pub, *attackers, honest):
                await b.stop()

    asyncio.run(main())


def test_watch_slots_refuse_a_peer_that_already_holds_as_many_as_the_heaviest() -> None:
    writers = [_FakeWriter() for _ in range(6)]
    slots = WatchSlots(max_total=3, max_per_peer=2)
    first = slots.admit(b"a", writers[0])  # type: ignore[arg-type]
    assert first is not None
    assert slots.admit(b"b", writers[1]) is not None  # type: ignore[arg-type]
    assert slots.admit(b"c", writers[2]) is not None  # type: ignore[arg-type]
    # full, and every peer holds one: a second watch of `a` would take an equal's slot
    assert slots.admit(b"a", writers[3]) is None  # type: ignore[arg-type]
    assert len(slots) == 3 and slots.evictions == 0
    # a newcomer holding none takes the oldest watch among the heaviest (all hold one: a's)
    assert slots.admit(b"d", writers[4]) is not None  # type: ignore[arg-type]
    assert first.evicted and writers[0].closed and slots.held_by(b"a") == 0
    slots.release(first)  # the evicted stream's handler releasing it changes nothing
    assert len(slots) == 3


class _FakeWriter:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_watches_end_after_their_lifetime_and_fetchers_reopen_them(swarm: Swarm, tmp_path: Path) -> None:
    publisher, attacker_node, honest_node = swarm.nodes[1], swarm.nodes[2], swarm.nodes[4]

    async def main() -> None:
        pub = await start_broadcast(
            publisher, tmp_path / "pub", [publisher], watch_lifetime_s=1.2, upload_bytes_per_s=100_000
        )
        attacker = await start_broadcast(attacker_node, tmp_path / "a", [publisher], serve=False)
        honest = await start_broadcast(honest_node, tmp_path / "honest", [publisher])
        held: list[Stream] = []
        try:
            state = make_state_dict(seed=33)  # ~4 s at the upload cap
            manifest = await pub.publish("lifetime", 1, state)
            held = await hold_watches(attacker, publisher.identity.peer_id, manifest, 1)
            assert len(held) == 1
            assert await ends(held[0])  # the watch ended by itself
            fetch = asyncio.create_task(honest.fetch("lifetime"))
            await async_wait_until(lambda: honest.last_fetch is not None, timeout_s=30)
            entry = await asyncio.wait_for(fetch, timeout=60)
            assert entry.complete
            assert_state_dicts_equal(await honest.load("lifetime", 1), state)
            assert pub.service.watches.expired >= 2  # the honest fetch outlived its first watch
        finally:
            close_all(held)
            for b in (pub, attacker, honest):
                await b.stop()

    asyncio.run(main())
