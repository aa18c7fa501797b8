"""A few identities holding every upload stream of a publisher do not keep an honest peer from fetching
(issue 12, 'upload-slot exhaustion').

On 127.0.0.1: a publisher whose manifest and chunk streams are capped at 4 in total and 2 per
peer, and two attackers (plain hivemind P2P daemons, fresh identities) that open 2 chunk streams
each and never send a request, holding all 4 slots for as long as the publisher lets a silent
stream live (`stream_idle_timeout_s`, two minutes). With caps alone the honest fetch was refused
as busy until then; with fair-share admission (`node.stream_slots`) its streams preempt the
attackers' and the fetch completes, while the attackers are told they were preempted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hivemind.p2p import P2P

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.requests import Stream
from node.broadcast.service import PREEMPTED_DETAIL, PROTO_CHUNK, parse_request
from node.broadcast.wire import read_frame
from protocol import broadcast_pb2 as bpb
from protocol.limits import MAX_RESPONSE_HEADER_BYTES
from tests.helpers.broadcast import (
    Swarm,
    assert_state_dicts_equal,
    async_wait_until,
    make_state_dict,
    open_swarm,
    start_broadcast,
)

MAX_STREAMS, MAX_PER_PEER = 4, 2
ATTACKERS = MAX_STREAMS // MAX_PER_PEER


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"), num_nodes=2)


def upload_streams(broadcast: WeightBroadcast) -> int:
    return broadcast.service.uploads.total


async def hold_silent_streams(attacker: P2P, target: WeightBroadcast, count: int) -> list[Stream]:
    """Open `count` chunk streams to `target` and send nothing on them (a request that never comes)."""
    streams = []
    for _ in range(count):
        _, reader, writer = await attacker.call_binary_stream_handler(target.p2p.peer_id, PROTO_CHUNK)
        streams.append((reader, writer))
    return streams


async def answers(streams: list[Stream], expected: int) -> list[bpb.ResponseHeader | None]:
    """What the server sent on the silent streams it closed (None: closed without a word), once
    `expected` of them have ended; the streams it still holds are left out."""
    reads = [asyncio.ensure_future(read_frame(reader, MAX_RESPONSE_HEADER_BYTES)) for reader, _ in streams]
    try:
        await async_wait_until(lambda: sum(r.done() for r in reads) >= expected, timeout_s=10)
    finally:
        for read in reads:
            read.cancel()
    ended = [r for r in reads if r.done() and not r.cancelled()]
    return [
        None
        if r.exception() is not None or r.result() is None
        else parse_request(r.result(), bpb.ResponseHeader)  # type: ignore[arg-type]
        for r in ended
    ]


def test_silent_streams_of_a_few_identities_do_not_block_an_honest_fetch(
    swarm: Swarm, tmp_path: Path
) -> None:
    publisher, honest_node = swarm.nodes

    async def main() -> None:
        pub = await start_broadcast(
            publisher,
            tmp_path / "pub",
            [publisher],
            max_upload_streams=MAX_STREAMS,
            max_upload_streams_per_peer=MAX_PER_PEER,
        )
        honest = await start_broadcast(honest_node, tmp_path / "honest", [publisher])
        maddrs = [str(a) for a in publisher.dht.get_visible_maddrs()]
        attackers = [await P2P.create(initial_peers=maddrs) for _ in range(ATTACKERS)]
        held: list[Stream] = []
        try:
            state = make_state_dict(seed=41, total_floats=40_000)
            await pub.publish("uploadslots", 1, state)
            for attacker in attackers:
                held += await hold_silent_streams(attacker, pub, MAX_PER_PEER)
            await async_wait_until(lambda: upload_streams(pub) == MAX_STREAMS, timeout_s=10)
            entry = await asyncio.wait_for(honest.fetch("uploadslots", manifest_timeout_s=5.0), timeout=60)
            assert entry.complete
            assert_state_dicts_equal(await honest.load("uploadslots", 1), state)
            # the honest streams took attackers' slots, and each attacker that lost one was told why
            taken = pub.service.uploads.preemptions
            assert taken >= 1
            told = await answers(held, expected=taken)
            assert len(told) == taken
            assert all(
                h is not None and (h.status, h.detail) == (bpb.STATUS_BUSY, PREEMPTED_DETAIL) for h in told
            )
        finally:
            for _, writer in held:
                writer.close()
            for attacker in attackers:
                await attacker.shutdown()
            for b in (pub, honest):
                await b.stop()

    asyncio.run(main())
