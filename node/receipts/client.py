"""The pulling side of the receipts exchange: fetch a peer's receipts, page by page, into a ledger.

`pull_receipts` dials a peer **by PeerID only** (its addresses come from the node's own peer store,
filled from the peer's signed node record, never from a message), asks for the receipts after a
cursor and stores every page through `Ledger.add_many`, which re-verifies each envelope. What one
pull may cost is bounded: at most `max_receipts` receipts, pages of at most `page_size`, response
frames capped at `MAX_RECEIPTS_RESPONSE_BYTES` on their declared length (before buffering) and one
overall timeout; with a `SignerQuota`, new receipts of a signer past its quota are left unverified
and counted, and the pull resumes at their page next time (`node.receipts.quota`).

A server that breaks the protocol is banned: an oversized or malformed response, a page larger
than asked, a cursor that does not move forward, or a receipt that is not genuinely signed for
this run (forged, altered, of another run, self-issued). Such a receipt is never stored. A receipt
that is genuine but expired, or issued ahead of this node's clock, is skipped without a ban: an
honest server may hold one. A server that refuses (busy, another run) or vanishes is not punished.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError, P2PHandlerError

from node.bans import BanList
from node.broadcast.wire import TruncatedFrame, read_frame, write_frame
from node.ledger import Ledger
from node.receipts.quota import SignerQuota
from node.receipts.server import PROTO_RECEIPTS
from node.receipts.standing import StandingFilter
from node.runtime import offload
from protocol import receipts_exchange_pb2 as xpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_RECEIPTS_PER_PAGE, MAX_RECEIPTS_RESPONSE_BYTES
from protocol.receipts import MAX_RECEIPT_BYTES, open_receipt, receipt_id
from protocol.untrusted import parse_untrusted


@dataclass
class PullResult:
    """What one pull from one peer did."""

    peer: bytes
    cursor: int
    """The peer's ledger position the next pull resumes after."""
    received: int = 0
    """Receipts the peer sent (every one verified before it was stored)."""
    added: int = 0
    """New receipts stored."""
    duplicates: int = 0
    """Receipts the ledger already held."""
    skipped: int = 0
    """Genuine receipts not stored: expired, or issued ahead of this node's clock."""
    pages: int = 0
    complete: bool = False
    """The peer said it holds nothing after `cursor`."""
    failure: str = ""
    """Why the pull ended before `complete` or its receipt budget ("" if it did not)."""
    banned: bool = False
    """The peer broke the protocol or served an invalid receipt, and was banned."""
    unvouched_dropped: int = 0
    """Receipts of signers without standing left out over the budget of this peer or of all peers
    (`node.receipts.standing`); the cursor moves past them."""
    capped: int = 0
    """New receipts left unverified because their signer had used its quota (`SignerQuota`): the
    pull stopped at their page and the next one resumes there, so they wait for the signer's next
    window instead of being skipped."""


def check_page(response: xpb.ReceiptsResponse, cursor: int, limit: int) -> None:
    """Refuse (InvalidMessage) a page larger than asked, or one whose cursor does not move forward."""
    if len(response.receipts) > limit:
        raise InvalidMessage(f"a page of {len(response.receipts)} receipts where at most {limit} were asked")
    if response.next < cursor:
        raise InvalidMessage(f"the cursor went back from {cursor} to {response.next}")
    if (response.receipts or response.more) and response.next == cursor:
        raise InvalidMessage("a page that covers receipts but leaves the cursor where it was")


def _within_quota(
    ledger: Ledger, receipts: list[bytes], quota: SignerQuota, result: PullResult
) -> list[bytes]:
    """The receipts of a page that are new to the ledger and within their signers' quotas."""
    ids = [
        receipt_id(data) if isinstance(data, bytes) and len(data) <= MAX_RECEIPT_BYTES else b""
        for data in receipts
    ]
    seen = ledger.stored(ids)
    fresh = []
    for data, rid in zip(receipts, ids, strict=True):
        if rid not in seen or not rid:  # an unreadable one goes on to be refused (and its server banned)
            seen.add(rid)
            fresh.append(data)
    result.duplicates += len(receipts) - len(fresh)
    kept, dropped = quota.admit(fresh)
    result.capped += dropped
    return kept


def _store_page(
    ledger: Ledger,
    receipts: list[bytes],
    result: PullResult,
    quota: SignerQuota | None = None,
    standing: StandingFilter | None = None,
) -> None:
    """Verify and store one page (within `quota`, and within `standing`'s budgets for receipts of
    signers without standing); InvalidMessage if it holds a receipt that was never genuinely valid."""
    if quota is not None:
        receipts = _within_quota(ledger, receipts, quota, result)
    unvouched: list[bytes] = []
    if standing is not None:
        dropped_before = standing.dropped
        receipts, unvouched = standing.admit(ledger, result.peer, receipts)
        result.unvouched_dropped += standing.dropped - dropped_before
    outcome = ledger.add_many(receipts)
    if standing is not None:
        standing.stored(ledger, result.peer, unvouched)
    for position, reason in outcome.refused:
        try:
            # valid when issued: only its age (or our clock) keeps it out, so the server is honest
            open_receipt(receipts[position], run_id=ledger.run_id, audit=True)
        except InvalidMessage as exc:
            raise InvalidMessage(f"receipt {position} of a page is invalid ({reason}): {exc}") from None
        result.skipped += 1
    result.added += outcome.added
    result.duplicates += outcome.duplicates


async def pull_receipts(
    p2p: P2P,
    peer: PeerID,
    ledger: Ledger,
    *,
    bans: BanList,
    after: int = 0,
    max_receipts: int = 4 * MAX_RECEIPTS_PER_PAGE,
    page_size: int = MAX_RECEIPTS_PER_PAGE,
    timeout_s: float = 30.0,
    quota: SignerQuota | None = None,
    standing: StandingFilter | None = None,
) -> PullResult:
    """Pull at most `max_receipts` of `peer`'s receipts stored after its position `after` into `ledger`.

    `quota`: new receipts of a signer past its quota are left unverified (`PullResult.capped`), and
    the pull stops before their page so that the next one asks for it again. `standing`: receipts
    of signers without standing are kept only within its budgets (`node.receipts.standing`).
    Never raises for what the peer does: the result says what was stored, where to resume, and why
    the pull stopped early (a banned peer is not contacted at all).
    """
    if not 1 <= page_size <= MAX_RECEIPTS_PER_PAGE:
        raise ValueError(f"page_size must be 1-{MAX_RECEIPTS_PER_PAGE}, got {page_size}")
    result = PullResult(peer=peer.to_bytes(), cursor=after)
    if bans.is_banned(peer):
        result.failure = "the peer is banned"
        return result
    short = peer.to_base58()[-8:]
    try:
        async with asyncio.timeout(timeout_s):
            _, reader, writer = await p2p.call_binary_stream_handler(peer, PROTO_RECEIPTS)
            try:
                await _pull_pages(reader, writer, ledger, result, max_receipts, page_size, quota, standing)
            finally:
                writer.close()
    except TimeoutError:
        result.failure = f"peer {short} did not finish within {timeout_s:g} s"
    except TruncatedFrame:
        result.failure = f"peer {short} closed the stream inside a frame"
    except InvalidMessage as exc:
        bans.ban(peer, f"bad receipts: {exc}")
        result.banned = True
        result.failure = f"peer {short} banned: {exc}"
    except (P2PDaemonError, P2PHandlerError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
        result.failure = f"could not pull from peer {short}: {exc!r}"
    return result


async def _pull_pages(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ledger: Ledger,
    result: PullResult,
    max_receipts: int,
    page_size: int,
    quota: SignerQuota | None,
    standing: StandingFilter | None = None,
) -> None:
    while result.received < max_receipts:
        limit = min(page_size, max_receipts - result.received)
        request = xpb.ReceiptsRequest(run_id=ledger.run_id, after=result.cursor, limit=limit)
        # a peer that refuses us answers first and closes: its reason is still there to be read
        with contextlib.suppress(ConnectionError, OSError):
            await write_frame(writer, request.SerializeToString())
        frame = await read_frame(reader, MAX_RECEIPTS_RESPONSE_BYTES)
        if frame is None:
            raise ConnectionError("the peer closed the stream without an answer")
        response = parse_untrusted(xpb.ReceiptsResponse, frame, "receipts response")
        if response.error:
            result.failure = f"refused: {response.error[:200]}"
            return
        check_page(response, result.cursor, limit)
        receipts = list(response.receipts)
        result.received += len(receipts)
        capped_before = result.capped
        if receipts:
            await offload(_store_page, ledger, receipts, result, quota, standing)
        if result.capped > capped_before:
            # the cursor stays before this page: its surplus is asked for again, not skipped for good
            result.failure = f"{result.capped - capped_before} receipts wait for their signers' quota"
            return
        result.cursor = response.next
        result.pages += 1
        if not response.more:
            result.complete = True
            return
