"""Bans on record: the workers that validators banned, read from the signed verdicts that banned them.

A validator that rejects a rollout for tampering bans its worker, and the verdict of that rollout
carries the ban's end (`RolloutVerdict.banned_until`). The ledger stores the verdict's envelope,
so the ban is decoded from it here (the ledger verified the signature when it stored it). Only
bans signed by a validator the run trusts are listed: anyone can sign a verdict, and a sybil
"validator" must not be able to brand an honest worker as banned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol import rollouts_pb2
from protocol.receipts import Receipt, ReceiptKind, stored_payload

MAX_ROWS = 500
"""Most banned workers listed."""
RECEIPTS_PER_BAN = 50
"""Newest banning verdicts kept per worker."""

Json = dict[str, Any]


@dataclass
class WorkerBans:
    """What the trusted validators' verdicts say about the bans of one worker."""

    worker: bytes
    bans: int = 0
    banned_until: float = 0.0
    """The latest end of any of its bans (validators' clocks)."""
    reasons: dict[str, int] = field(default_factory=dict)
    validators: set[bytes] = field(default_factory=set)
    receipts: deque[Receipt] = field(default_factory=lambda: deque(maxlen=RECEIPTS_PER_BAN))

    def add(self, receipt: Receipt, until: float) -> None:
        self.bans += 1
        self.banned_until = max(self.banned_until, until)
        self.reasons[receipt.reason] = self.reasons.get(receipt.reason, 0) + 1
        self.validators.add(receipt.signer)
        self.receipts.append(receipt)


class BanTally:
    """Collects the bans on record while a snapshot reads the ledger (`note` every receipt once)."""

    def __init__(self, validators: frozenset[bytes]) -> None:
        self.validators = validators
        """Only the run's validators' bans are on record."""
        self.workers: dict[bytes, WorkerBans] = {}

    def note(self, receipt: Receipt) -> None:
        if (
            receipt.kind is not ReceiptKind.ROLLOUT
            or receipt.accepted
            or receipt.signer not in self.validators
        ):
            return
        verdict = stored_payload(receipt.envelope, rollouts_pb2.RolloutVerdict)
        if verdict is None or not verdict.banned_until:
            return
        worker = self.workers.get(receipt.contributor)
        if worker is None:
            worker = self.workers[receipt.contributor] = WorkerBans(receipt.contributor)
        worker.add(receipt, verdict.banned_until)

    def ranked(self) -> list[WorkerBans]:
        """Workers by the end of their latest ban, latest first."""
        return sorted(self.workers.values(), key=lambda w: -w.banned_until)


def bans_json(
    workers: list[WorkerBans], *, now: float, peer: Callable[[bytes], Json], receipts_url: Callable[..., str]
) -> list[Json]:
    """The verification panel's banned peers: each worker's bans, whether one lasts, and links to
    the rejections behind them (one link per reason)."""
    rows = []
    for worker in workers[:MAX_ROWS]:
        text = peer(worker.worker)
        rows.append(
            {
                **text,
                "bans": worker.bans,
                "banned_until": worker.banned_until,
                "active": worker.banned_until > now,
                "validators": len(worker.validators),
                "reasons": [
                    {
                        "reason": reason,
                        "count": count,
                        "receipts_url": receipts_url(contributor=text["peer_id"], reason=reason),
                    }
                    for reason, count in sorted(worker.reasons.items(), key=lambda item: -item[1])
                ],
            }
        )
    return rows
