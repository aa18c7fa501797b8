"""Upload-slot squatting of a weight publisher, from plain hivemind P2P clients on 127.0.0.1 (issue 12).

Shared by `tests/integration/swarm/test_upload_slot_squatting.py` and `bench/robustness.py`. The
publisher's manifest and chunk streams are capped at `MAX_STREAMS` in total and `MAX_PER_PEER`
per peer; `MAX_STREAMS / MAX_PER_PEER` attackers (fresh identities, each its own p2pd) open
`MAX_PER_PEER` chunk streams each and never send a request, holding every slot for as long as
the publisher lets a silent stream live (`stream_idle_timeout_s`, two minutes). Then an honest
node fetches a small version. Reported: whether the fetch completed, how many attacker streams
the publisher preempted, and what it told each of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from hivemind.p2p import P2P

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.requests import Stream
from node.broadcast.service import PREEMPTED_DETAIL, PROTO_CHUNK, parse_request
from node.broadcast.wire import read_frame
from protocol import broadcast_pb2 as bpb
from protocol.limits import MAX_RESPONSE_HEADER_BYTES
from tests.helpers.broadcast import SwarmNode, assert_state_dicts_equal, make_state_dict, start_broadcast
from tests.helpers.waiting import async_wait_until

MAX_STREAMS, MAX_PER_PEER = 4, 2
ATTACKERS = MAX_STREAMS // MAX_PER_PEER


@dataclass
class UploadSquatOutcome:
    """What squatting every upload stream of the publisher did to an honest fetch."""

    fetched: bool
    """The honest node fetched the version intact."""
    error: str
    """Why the fetch failed ("" if it did not)."""
    preemptions: int
    """Attacker streams the publisher preempted."""
    told_preempted: int
    """Of those, how many were told `STATUS_BUSY` with the "preempted" detail before being closed."""


async def hold_silent_streams(attacker: P2P, target: WeightBroadcast, count: int) -> list[Stream]:
    """Open `count` chunk streams to `target` and send nothing on them (a request that never comes)."""
    streams = []
    for _ in range(count):
        _, reader, writer = await attacker.call_binary_stream_handler(target.p2p.peer_id, PROTO_CHUNK)
        streams.append((reader, writer))
    return streams


async def told_preempted(streams: list[Stream], expected: int) -> int:
    """Once `expected` of the silent `streams` have ended (or after 10 s), how many of the ended ones
    the server told they were preempted."""
    reads = [asyncio.ensure_future(read_frame(reader, MAX_RESPONSE_HEADER_BYTES)) for reader, _ in streams]
    try:
        await async_wait_until(lambda: sum(r.done() for r in reads) >= expected, timeout_s=10)
    except AssertionError:
        pass
    finally:
        for read in reads:
            read.cancel()  # the streams the server still holds
        await asyncio.gather(*reads, return_exceptions=True)
    told = 0
    for read in reads:
        if read.cancelled() or read.exception() is not None or (frame := read.result()) is None:
            continue
        header = parse_request(frame, bpb.ResponseHeader)
        told += header.status == bpb.STATUS_BUSY and header.detail == PREEMPTED_DETAIL
    return told


async def squat_upload_slots(
    publisher: SwarmNode, honest_node: SwarmNode, root: Path, run_id: str = "uploadslots"
) -> UploadSquatOutcome:
    """Fill the publisher's upload streams from `ATTACKERS` identities, then fetch as `honest_node`."""
    pub = await start_broadcast(
        publisher,
        root / "publisher",
        [publisher],
        max_upload_streams=MAX_STREAMS,
        max_upload_streams_per_peer=MAX_PER_PEER,
    )
    honest = await start_broadcast(honest_node, root / "honest", [publisher])
    maddrs = [str(a) for a in publisher.dht.get_visible_maddrs()]
    attackers: list[P2P] = []
    held: list[Stream] = []
    try:
        for _ in range(ATTACKERS):
            attackers.append(await P2P.create(initial_peers=maddrs))
        state = make_state_dict(seed=41, total_floats=40_000)
        await pub.publish(run_id, 1, state)
        for attacker in attackers:
            held += await hold_silent_streams(attacker, pub, MAX_PER_PEER)
        await async_wait_until(lambda: pub.service.uploads.total == MAX_STREAMS, timeout_s=10)
        error = ""
        try:
            entry = await asyncio.wait_for(honest.fetch(run_id, manifest_timeout_s=5.0), timeout=60)
            assert entry.complete
            assert_state_dicts_equal(await honest.load(run_id, 1), state)
        except Exception as exc:
            error = repr(exc)
        preemptions = pub.service.uploads.preemptions
        return UploadSquatOutcome(
            fetched=not error,
            error=error,
            preemptions=preemptions,
            told_preempted=await told_preempted(held, preemptions),
        )
    finally:
        for _, writer in held:
            writer.close()
        for attacker in attackers:
            await attacker.shutdown()
        for broadcast in (pub, honest):
            await broadcast.stop()
