"""What the trusted receipts say each node did lately: the swarm table's policy and throughput columns.

Only receipts of a kind the run lets their signer sign count (`RunSigners.trusts`: a validator's
verdict, a trainer's training or validation receipt), and one piece of work counts once however many signers
attest it (`claim_of`), so a node cannot raise its figures by signing for itself, by minting
signers or by collecting one round's receipts from every member.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from node.ledger import RunSigners
from node.ledger.credit import claim_of
from protocol.receipts import Receipt, ReceiptKind

__all__ = ["THROUGHPUT_WINDOW_S", "NodeWork", "WorkTally"]

THROUGHPUT_WINDOW_S = 600.0
"""Throughput is the verified tokens of the last this many seconds before the snapshot."""


@dataclass(frozen=True)
class NodeWork:
    """One node's recent verified work."""

    policy_version: int | None
    """Newest policy version among its rollouts the run's validators accepted (None: no such rollout)."""
    tokens_per_min: float
    """Verified tokens (accepted rollouts, trained tokens, validated tokens a trainer took) per minute
    over `THROUGHPUT_WINDOW_S`."""


class WorkTally:
    """Reads receipts one by one (`add`), then gives each contributor's `NodeWork` (`finish`)."""

    def __init__(self, signers: RunSigners, now: float) -> None:
        self.signers = signers
        self.window_start = now - THROUGHPUT_WINDOW_S
        self._policy: dict[bytes, int] = {}
        self._tokens: dict[bytes, int] = defaultdict(int)
        self._claims: set[tuple[Any, ...]] = set()

    def add(self, receipt: Receipt) -> None:
        if receipt.kind not in (ReceiptKind.ROLLOUT, ReceiptKind.TRAINING, ReceiptKind.VALIDATION):
            return
        if not self.signers.trusts(receipt.kind, receipt.signer):
            return
        if receipt.kind is ReceiptKind.ROLLOUT:
            if not receipt.accepted:
                return
            held = self._policy.get(receipt.contributor, -1)
            self._policy[receipt.contributor] = max(held, receipt.step)
        if receipt.issued_at >= self.window_start:  # the ledger refuses receipts dated far ahead
            claim = claim_of(receipt)
            if claim not in self._claims:
                self._claims.add(claim)
                self._tokens[receipt.contributor] += receipt.tokens

    def finish(self) -> dict[bytes, NodeWork]:
        minutes = THROUGHPUT_WINDOW_S / 60.0
        return {
            peer: NodeWork(self._policy.get(peer), self._tokens.get(peer, 0) / minutes)
            for peer in {*self._policy, *self._tokens}
        }
