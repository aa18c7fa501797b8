"""`ReceiptServer`: the serving side of the receipts exchange, a node's ledger page by page.

Protocol `PROTO_RECEIPTS`: the puller opens a stream and sends `ReceiptsRequest` frames (run,
cursor, limit), one after another; each is answered with one `ReceiptsResponse` holding at most
`limit` signed receipts stored after the cursor, the cursor to continue from and whether more
follow. The cursor is the ledger's own position (`Ledger.page`), which only grows.

The hardening is `node.rollouts.streams.FramedService`'s: banned peers and peers over the total or
per-peer stream cap are refused before their stream is read; a request frame longer than
`MAX_RECEIPTS_REQUEST_BYTES` is refused on its declared length, before it is buffered, and a
malformed request (or one asking for no receipts or more than a page) bans its sender; each frame
must arrive within `frame_timeout_s`. A request for another run is answered with an error, not a
ban (it is an honest mistake). Receipts that have clearly expired are left out of the page, since
a puller would refuse them; the cursor still moves past them.
"""

from __future__ import annotations

import time

import hivemind
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.ledger import Ledger
from node.receipts.config import ReceiptsConfig
from node.rollouts.streams import FramedService, clip
from node.runtime import offload
from protocol import receipts_exchange_pb2 as xpb
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_CLOCK_SKEW_S,
    MAX_RECEIPTS_PER_PAGE,
    MAX_RECEIPTS_REQUEST_BYTES,
    MAX_RECEIPTS_RESPONSE_BYTES,
    RECEIPT_TTL_S,
)
from protocol.untrusted import parse_untrusted
from protocol.version import PROTOCOL_VERSION

PROTO_RECEIPTS = f"/hivenet/{PROTOCOL_VERSION}/receipts/pull"
MAX_CURSOR = 2**63 - 1
"""The largest ledger position (SQLite's largest rowid)."""


def receipts_response(
    *, receipts: list[bytes] | None = None, next_cursor: int = 0, more: bool = False, error: str = ""
) -> bytes:
    """A serialized ReceiptsResponse."""
    return xpb.ReceiptsResponse(
        receipts=receipts or [], next=next_cursor, more=more, error=clip(error)
    ).SerializeToString()


def parse_receipts_request(frame: bytes) -> xpb.ReceiptsRequest:
    """A request frame (already size-capped) parsed strictly; InvalidMessage if malformed or out of bounds."""
    request = parse_untrusted(xpb.ReceiptsRequest, frame, "receipts request")
    if not 1 <= request.limit <= MAX_RECEIPTS_PER_PAGE:
        raise InvalidMessage(
            f"receipts request asks for {request.limit} receipts, not 1-{MAX_RECEIPTS_PER_PAGE}"
        )
    if request.after > MAX_CURSOR:
        raise InvalidMessage(f"receipts request cursor {request.after} is beyond any ledger position")
    return request


class ReceiptServer(FramedService):
    """Serves `ledger` on `PROTO_RECEIPTS`; construct, then `await start()` (`ReceiptExchange` does)."""

    name = "receipt-server"
    proto = PROTO_RECEIPTS
    what = "receipts request"

    def __init__(
        self,
        *,
        dht: hivemind.DHT | None,
        ledger: Ledger,
        config: ReceiptsConfig | None = None,
        p2p: P2P | None = None,
        bans: BanList | None = None,
        owner: str = "",
    ) -> None:
        config = config if config is not None else ReceiptsConfig()
        super().__init__(
            dht=dht,
            config=config,
            max_frame_bytes=MAX_RECEIPTS_REQUEST_BYTES,
            p2p=p2p,
            bans=bans,
            owner=owner,
        )
        self.ledger = ledger
        self.pages_served = 0
        self.receipts_served = 0

    def error_response(self, error: str) -> bytes:
        return receipts_response(error=error)

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        request = parse_receipts_request(frame)
        if request.run_id != self.ledger.run_id:
            return receipts_response(
                error=f"this node records run {self.ledger.run_id!r}, not {request.run_id[:64]!r}"
            )
        rows = await offload(self.ledger.page, request.after, request.limit)
        fresh_after = time.time() - RECEIPT_TTL_S + MAX_CLOCK_SKEW_S
        receipts = [row.envelope for row in rows if row.issued_at > fresh_after]
        next_cursor = rows[-1].seq if rows else request.after
        response = receipts_response(
            receipts=receipts, next_cursor=next_cursor, more=len(rows) == request.limit
        )
        assert len(response) <= MAX_RECEIPTS_RESPONSE_BYTES
        self.pages_served += 1
        self.receipts_served += len(receipts)
        return response
