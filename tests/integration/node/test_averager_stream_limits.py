"""The averager's inbound streams are capped, timed out and counted per peer (`node.averaging.stream_limits`).

A plain hivemind P2P client on 127.0.0.1 attacks one `DiLoCoAverager`: it declares a 2^40-byte
message and streams 256 MiB (the averager process must grow by far less: a quarter of it at most,
whatever else a loaded machine makes it allocate meanwhile), opens a silent stream
(closed after the timeout), sends a truncated message and one that does not parse (closed, the
latter banned: its next join request is answered PROTOCOL_VIOLATION), and opens more streams than
a peer may hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import psutil
import pytest
import torch
from hivemind.p2p import P2P

from node.averaging.averager import DiLoCoAverager
from protocol.limits import MAX_AVERAGER_STREAMS_PER_PEER
from tests.helpers.averager_streams import attacker_p2p, is_banned, open_stream, stream_oversized_message
from tests.helpers.trainers import averager_swarm
from tests.helpers.waiting import async_wait_until

SHAPES = [torch.Size([1000]), torch.Size([10, 10])]
TIMEOUT_S = 2.0
PREFIX = "streamtest"
ATTACK_BYTES = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def target() -> Iterator[DiLoCoAverager]:
    torch.set_num_threads(1)
    with averager_swarm(SHAPES, [DiLoCoAverager], prefix=PREFIX, sender_timeout_s=TIMEOUT_S) as averagers:
        yield averagers[0]


async def _seconds_until_closed(reader: asyncio.StreamReader, limit_s: float) -> float:
    start = time.monotonic()
    async with asyncio.timeout(limit_s):
        while await reader.read(1 << 16):
            pass
    return time.monotonic() - start


def test_an_oversized_declared_message_is_refused_before_it_is_buffered(target: DiLoCoAverager) -> None:
    outcome = asyncio.run(stream_oversized_message(target, ATTACK_BYTES))
    print(f"oversized: {outcome.streams} streams each declared 2^40 bytes")
    print(
        f"oversized: streamed {outcome.sent / 2**20:.0f} MiB, averager RSS grew by {outcome.growth / 2**20:.1f} MiB"
    )
    assert outcome.growth < ATTACK_BYTES // 4, f"the averager grew by {outcome.growth / 2**20:.0f} MiB"
    assert outcome.banned


def test_a_silent_stream_is_closed_after_the_timeout(target: DiLoCoAverager) -> None:
    async def attack() -> float:
        p2p = await attacker_p2p(target)
        try:
            reader, _writer = await open_stream(p2p, target, "rpc_join_group")
            return await _seconds_until_closed(reader, TIMEOUT_S + 10)
        finally:
            await p2p.shutdown()

    closed_after = asyncio.run(attack())
    print(f"silent: closed after {closed_after:.1f} s (timeout {TIMEOUT_S} s)")
    assert TIMEOUT_S - 0.5 <= closed_after <= TIMEOUT_S + 5


def test_a_truncated_message_does_not_hang_the_handler(target: DiLoCoAverager) -> None:
    async def attack() -> float:
        p2p = await attacker_p2p(target)
        try:
            reader, writer = await open_stream(p2p, target, "rpc_download_state")
            writer.write(P2P.MESSAGE_MARKER + (100).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + bytes(50))
            await writer.drain()
            return await _seconds_until_closed(reader, TIMEOUT_S + 10)
        finally:
            await p2p.shutdown()

    closed_after = asyncio.run(attack())
    print(f"truncated: closed after {closed_after:.1f} s")
    assert closed_after <= TIMEOUT_S + 5


def test_a_message_that_does_not_parse_is_refused_and_its_sender_banned(target: DiLoCoAverager) -> None:
    async def attack() -> tuple[float, bool]:
        p2p = await attacker_p2p(target)
        try:
            assert not await is_banned(p2p, target)
            reader, writer = await open_stream(p2p, target, "rpc_join_group")
            garbage = b"\x0a\xff\xff\xff\x0f"  # field 1, length-delimited, declares far more than follows
            writer.write(P2P.MESSAGE_MARKER + len(garbage).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + garbage)
            await writer.drain()
            closed_after = await _seconds_until_closed(reader, TIMEOUT_S + 10)
            return closed_after, await is_banned(p2p, target)
        finally:
            await p2p.shutdown()

    closed_after, banned = asyncio.run(attack())
    assert closed_after < TIMEOUT_S
    assert banned


def test_a_peer_cannot_hold_more_streams_than_its_share(target: DiLoCoAverager) -> None:
    """200 silent join streams from one peer: all but its share are closed at once, the rest after
    the timeout, and the averager's file descriptors come back to what they were."""
    opened = 200
    process = psutil.Process(target.pid)

    async def attack() -> tuple[int, int, int, int]:
        p2p = await attacker_p2p(target)
        try:
            fds_before = process.num_fds()
            streams = [await open_stream(p2p, target, "rpc_join_group") for _ in range(opened)]

            async def closed_at_once(reader: asyncio.StreamReader) -> bool:
                try:
                    await _seconds_until_closed(reader, TIMEOUT_S / 2)
                    return True
                except TimeoutError:
                    return False

            refused = await asyncio.gather(*(closed_at_once(reader) for reader, _ in streams))
            fds_held = process.num_fds()
            await asyncio.gather(*(_seconds_until_closed(reader, TIMEOUT_S + 5) for reader, _ in streams))
            with contextlib.suppress(AssertionError):  # the descriptors go once the streams are torn down
                await async_wait_until(lambda: process.num_fds() <= fds_before + 4, timeout_s=10)
            fds_after = process.num_fds()
            for _, writer in streams:
                writer.close()
            return sum(refused), fds_before, fds_held, fds_after
        finally:
            await p2p.shutdown()

    refused, fds_before, fds_held, fds_after = asyncio.run(attack())
    print(
        f"concurrency: {refused} of {opened} silent streams refused at once; averager fds "
        f"{fds_before} before, {fds_held} while held, {fds_after} after the timeout"
    )
    assert refused >= opened - MAX_AVERAGER_STREAMS_PER_PEER
    assert fds_held <= fds_before + MAX_AVERAGER_STREAMS_PER_PEER + 4
    assert fds_after <= fds_before + 4
