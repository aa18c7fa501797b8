"""A plain hivemind P2P client attacking a `DiLoCoAverager`'s stream handlers on 127.0.0.1.

Shared by `tests/integration/node/test_averager_stream_limits.py` and `bench/robustness.py`: open a raw
stream to one of the averager's handlers, ask whether the averager bans us, and the oversized
message attack (declare a 2^40-byte message, then stream zeros into it) with the RSS of the
averager's process (hivemind runs it in a child process) sampled before, during and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import psutil
from hivemind.p2p import P2P
from hivemind.proto import averaging_pb2

from node.averaging.averager import DiLoCoAverager

DECLARED_MESSAGE_BYTES = 1 << 40
ATTACK_CHUNK_BYTES = 1 << 20


async def attacker_p2p(target: DiLoCoAverager) -> P2P:
    """A plain hivemind P2P daemon on loopback that knows the target's DHT (shut it down when done)."""
    maddrs = [str(a) for a in target.dht.get_visible_maddrs()]
    return await P2P.create(initial_peers=maddrs)


async def open_stream(
    p2p: P2P, target: DiLoCoAverager, method: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw stream to the target's handler of `method` (e.g. `rpc_join_group`)."""
    handle = f"{target.prefix}::DiLoCoAverager.{method}"
    _, reader, writer = await p2p.call_binary_stream_handler(target.peer_id, handle)
    return reader, writer


async def is_banned(p2p: P2P, target: DiLoCoAverager) -> bool:
    """Whether the target answers our well-formed join request with PROTOCOL_VIOLATION."""
    stub = target.get_stub(p2p, target.peer_id, namespace=target.prefix)
    request = averaging_pb2.JoinRequest(schema_hash=b"x", expiration=time.time() + 10, group_key="k")
    async for answer in await stub.rpc_join_group(request):
        return answer.code == averaging_pb2.PROTOCOL_VIOLATION
    return False


@dataclass
class OversizedOutcome:
    """What streaming into a message declared far too large did to the averager."""

    rss_before: int
    rss_peak: int
    rss_after: int
    sent: int
    streams: int
    banned: bool

    @property
    def growth(self) -> int:
        """Peak RSS of the averager's process over its RSS before the attack, in bytes."""
        return self.rss_peak - self.rss_before


async def stream_oversized_message(
    target: DiLoCoAverager, total_bytes: int, *, max_streams: int | None = None
) -> OversizedOutcome:
    """Declare a 2^40-byte aggregation part and stream `total_bytes` of it into the target.

    When the target closes the stream, declare again on a new one, up to `max_streams` streams
    (no limit when None), until `total_bytes` are sent. The target's RSS is read before the
    first stream, after every chunk, and once the target has closed the last stream (or 10 s
    after it was sent, if the target keeps it open).
    """
    process = psutil.Process(target.pid)
    p2p = await attacker_p2p(target)
    try:
        if await is_banned(p2p, target):  # also warms up the handler's code paths
            raise RuntimeError("the attacker is banned before it attacked")
        before = process.memory_info().rss
        peak, sent, streams = before, 0, 0
        chunk = bytes(ATTACK_CHUNK_BYTES)
        header = P2P.MESSAGE_MARKER + DECLARED_MESSAGE_BYTES.to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER)
        reader, writer = None, None
        while sent < total_bytes and (max_streams is None or streams < max_streams):
            reader, writer = await open_stream(p2p, target, "rpc_aggregate_part")
            streams += 1
            writer.write(header)
            try:
                while sent < total_bytes:
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), 10)
                    sent += len(chunk)
                    peak = max(peak, process.memory_info().rss)
            except (ConnectionError, TimeoutError, OSError):
                writer.close()
        if reader is not None:  # what was in flight has reached the target once it closes the stream
            with contextlib.suppress(TimeoutError, ConnectionError, OSError):
                await asyncio.wait_for(reader.read(), 10)
        after = process.memory_info().rss
        if writer is not None:
            writer.close()
        return OversizedOutcome(before, max(peak, after), after, sent, streams, await is_banned(p2p, target))
    finally:
        await p2p.shutdown()
