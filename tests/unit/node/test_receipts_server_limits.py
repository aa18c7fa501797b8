"""The receipts server's limits, driven through `handle_stream` with in-memory streams (no libp2p):
an oversized request refused on its declared length and its sender banned, malformed and
out-of-bounds requests, the per-peer and total stream caps, and the pages it answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import PeerID

from node.broadcast.wire import encode_frame
from node.ledger import Ledger
from node.receipts import ReceiptsConfig, ReceiptServer, check_page
from protocol import receipts_exchange_pb2 as xpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_RECEIPTS_PER_PAGE, MAX_RECEIPTS_REQUEST_BYTES
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer
from tests.helpers.rollouts import RecordingWriter, key, peer_bytes
from tests.helpers.waiting import async_wait_until

PULLERS = [PeerID(peer_bytes(key(f"puller {i}"))) for i in range(3)]


def _server(ledger: Ledger, **config: Any) -> ReceiptServer:
    return ReceiptServer(dht=None, ledger=ledger, config=ReceiptsConfig(**config))


def _request(after: int = 0, limit: int = 10, run_id: str = RUN) -> bytes:
    return encode_frame(xpb.ReceiptsRequest(run_id=run_id, after=after, limit=limit).SerializeToString())


async def _serve(server: ReceiptServer, peer: PeerID, data: bytes) -> list[xpb.ReceiptsResponse]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    writer = RecordingWriter()
    await server.handle_stream(peer, reader, writer)  # type: ignore[arg-type]
    return [xpb.ReceiptsResponse.FromString(frame) for frame in writer.responses()]


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    signer, _ = new_peer()
    with Ledger(tmp_path / "served.db", RUN) as opened:
        opened.add_many([make.transfer(signer, new_peer()[1]) for _ in range(7)])
        yield opened


def test_pages_follow_the_cursor_to_the_end_on_one_stream(ledger: Ledger) -> None:
    async def main() -> None:
        server = _server(ledger)
        first, second, third = await _serve(
            server, PULLERS[0], _request(0, 3) + _request(3, 3) + _request(6, 3)
        )
        assert [len(r.receipts) for r in (first, second, third)] == [3, 3, 1]
        assert [(r.next, r.more) for r in (first, second, third)] == [(3, True), (6, True), (7, False)]
        served = [*first.receipts, *second.receipts, *third.receipts]
        assert served == list(ledger.envelopes())
        (after_end,) = await _serve(server, PULLERS[0], _request(7, 3))
        assert (list(after_end.receipts), after_end.next, after_end.more) == ([], 7, False)

    asyncio.run(main())


def test_an_oversized_request_is_refused_before_it_is_buffered_and_its_sender_banned(ledger: Ledger) -> None:
    async def main() -> None:
        server = _server(ledger)
        reader = asyncio.StreamReader()
        declared = MAX_RECEIPTS_REQUEST_BYTES + 1
        reader.feed_data(declared.to_bytes(4, "big") + b"\x00" * 200)  # the body is never read
        writer = RecordingWriter(reader)
        task = asyncio.ensure_future(server.handle_stream(PULLERS[1], reader, writer))  # type: ignore[arg-type]
        await async_wait_until(lambda: writer.unread_at_first_write is not None, timeout_s=10)
        assert writer.unread_at_first_write == 200  # answered after reading the length alone
        reader.feed_eof()
        await task
        (response,) = [xpb.ReceiptsResponse.FromString(f) for f in writer.responses()]
        assert "exceeds" in response.error and "banned" in response.error
        assert server.bans.is_banned(PULLERS[1])
        (refused,) = await _serve(server, PULLERS[1], _request())
        assert "banned" in refused.error and not refused.receipts

    asyncio.run(main())


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (encode_frame(b"\xff\xff\xff"), "malformed"),
        (_request(limit=0), "asks for 0 receipts"),
        (_request(limit=MAX_RECEIPTS_PER_PAGE + 1), f"asks for {MAX_RECEIPTS_PER_PAGE + 1} receipts"),
        (_request(after=2**64 - 1), "beyond any ledger position"),
    ],
)
def test_malformed_or_out_of_bounds_requests_ban_their_sender(
    ledger: Ledger, frame: bytes, match: str
) -> None:
    async def main() -> None:
        server = _server(ledger)
        (response,) = await _serve(server, PULLERS[2], frame)
        assert match in response.error and not response.receipts
        assert server.bans.is_banned(PULLERS[2])

    asyncio.run(main())


def test_a_request_for_another_run_is_answered_with_an_error_and_no_ban(ledger: Ledger) -> None:
    async def main() -> None:
        server = _server(ledger)
        (response,) = await _serve(server, PULLERS[0], _request(run_id="another-run"))
        assert "records run" in response.error and not response.receipts
        assert not server.bans.is_banned(PULLERS[0])

    asyncio.run(main())


def test_a_peers_new_stream_replaces_its_idle_one_and_others_over_the_total_cap_are_busy(
    ledger: Ledger,
) -> None:
    async def main() -> None:
        server = _server(ledger, max_streams_per_peer=1, max_streams=2, refusal_linger_s=0.1)
        idle_readers = [asyncio.StreamReader(), asyncio.StreamReader()]  # peers that open a stream and wait
        idle = [
            asyncio.ensure_future(server.handle_stream(peer, reader, RecordingWriter()))  # type: ignore[arg-type]
            for peer, reader in zip(PULLERS[:2], idle_readers, strict=True)
        ]
        await async_wait_until(lambda: server.open_streams == 2, timeout_s=10)
        # a puller's next stream may arrive before the server sees its last one close: it is served,
        # and the idle stream it replaces ends (at most one stream per peer all along)
        (same_peer,) = await _serve(server, PULLERS[0], _request())
        assert len(same_peer.receipts) == 7 and not same_peer.error
        await asyncio.wait_for(idle[0], timeout=10)
        idle_readers[0] = asyncio.StreamReader()  # its stream after that one, held open
        idle[0] = asyncio.ensure_future(server.handle_stream(PULLERS[0], idle_readers[0], RecordingWriter()))  # type: ignore[arg-type]
        await async_wait_until(lambda: server.open_streams == 2, timeout_s=10)
        (other_peer,) = await _serve(server, PULLERS[2], _request())
        assert "too many streams" in other_peer.error and not other_peer.receipts
        for reader in idle_readers:
            reader.feed_eof()
        await asyncio.gather(*idle)
        (served,) = await _serve(server, PULLERS[2], _request())
        assert len(served.receipts) == 7 and not served.error
        assert not any(server.bans.is_banned(peer) for peer in PULLERS)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("response", "cursor", "limit", "match"),
    [
        (xpb.ReceiptsResponse(receipts=[b"a", b"b"], next=9, more=True), 5, 1, "at most 1"),
        (xpb.ReceiptsResponse(receipts=[], next=4), 5, 10, "went back"),
        (xpb.ReceiptsResponse(receipts=[b"a"], next=5), 5, 10, "leaves the cursor"),
        (xpb.ReceiptsResponse(receipts=[], next=5, more=True), 5, 10, "leaves the cursor"),
    ],
)
def test_a_puller_refuses_pages_that_break_the_protocol(
    response: xpb.ReceiptsResponse, cursor: int, limit: int, match: str
) -> None:
    with pytest.raises(InvalidMessage, match=match):
        check_page(response, cursor, limit)
    check_page(xpb.ReceiptsResponse(receipts=[], next=cursor), cursor, limit)  # the honest end
