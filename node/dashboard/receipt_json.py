"""One receipt as the dashboard's JSON API shows it: who signed it for whom, what it attests, and how
it counted in the snapshot's credit report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.dashboard.snapshot import LedgerSnapshot
from protocol import rollouts_pb2
from protocol.receipts import Receipt, ReceiptKind, stored_payload

__all__ = ["receipt_json"]


def receipt_json(
    receipt: Receipt,
    snap: LedgerSnapshot,
    *,
    text: Callable[[bytes], str],
    name: Callable[[bytes], str],
    detail: bool = False,
) -> dict[str, Any]:
    """`receipt` as JSON; `text` and `name` give a peer's PeerID text and public name; `detail`: with the
    validator's figures behind a rejection."""
    standing = snap.report.standing.get(receipt.receipt_id)
    item: dict[str, Any] = {
        "id": receipt.receipt_id.hex(),
        "kind": receipt.kind.value,
        "role": receipt.role,
        "signer": text(receipt.signer),
        "signer_name": name(receipt.signer),
        "contributor": text(receipt.contributor),
        "contributor_name": name(receipt.contributor),
        "issued_at": receipt.issued_at,
        "step": receipt.step,
        "tokens": receipt.tokens,
        "bytes": receipt.byte_count,
        "chunks": receipt.chunks,
        "count": receipt.count,
        "accepted": receipt.accepted,
        "reason": receipt.reason,
        "evidence": receipt.evidence.hex(),
        "standing": standing.value if standing else "new",
        "counted": round(snap.report.counted.get(receipt.receipt_id, 0.0), 3),
        "url": f"/api/receipt/{receipt.receipt_id.hex()}",
    }
    if detail and receipt.kind is ReceiptKind.ROLLOUT and not receipt.accepted and receipt.envelope:
        item["detail"] = _verdict_detail(receipt)
    return item


def _verdict_detail(receipt: Receipt) -> str:
    """The validator's human-readable figures behind a rejection, decoded from the stored verdict.

    The ledger verified the envelope's signature when it stored it, so it is only decoded here.
    """
    verdict = stored_payload(receipt.envelope, rollouts_pb2.RolloutVerdict)
    return "" if verdict is None else str(verdict.detail)
