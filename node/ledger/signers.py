"""Who a run trusts to sign each kind of receipt.

A receipt is only as good as its signer's place in the run: a rollout verdict means something
when one of the run's validators signed it, a training receipt when one of its trainers did, and
a validation receipt (a trainer took a group a standalone validator forwarded) when one of its
trainers did.
Transfer and seed receipts attest services any node can render and receive, so any signer the
run trusts counts for them, and a signer vouched for by a trusted one counts capped (see
`node.ledger.credit`). A training receipt from a signer the run does not name counts only when
that signer earned trainer credit from the run's trainers (an open run's volunteer trainer,
vouched for by the named trainers it averaged with), capped the same way. Rollout verdicts and
validation receipts are never vouched for. So a worker that earned credit cannot pass it on to
identities that did no work by signing verdicts, training or validation receipts for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.receipts import ReceiptKind

__all__ = ["VOUCHING_ROLE", "RunSigners"]

VOUCHING_ROLE: dict[ReceiptKind, str | None] = {
    ReceiptKind.TRANSFER: None,
    ReceiptKind.SEED: None,
    ReceiptKind.TRAINING: ReceiptKind.TRAINING.role,
}
"""The kinds a signer without a role may sign when vouched for, and the role whose credit vouches
for it (None: credit in any role); rollout verdicts and validation receipts are absent: never
vouched for."""


@dataclass(frozen=True)
class RunSigners:
    """The signers of a run by the receipts they may sign."""

    validators: frozenset[bytes] = frozenset()
    """Signers of rollout verdicts: the run's validators (its trainers validate too)."""
    trainers: frozenset[bytes] = frozenset()
    """Signers of training and validation receipts: the run's trainers."""
    services: frozenset[bytes] = frozenset()
    """Further signers trusted for transfer and seed receipts only."""

    @classmethod
    def for_every_kind(cls, trusted: Iterable[bytes]) -> RunSigners:
        """Every one of `trusted` may sign every kind (what an operator's `--trusted` says)."""
        peers = frozenset(trusted)
        return cls(validators=peers, trainers=peers, services=peers)

    @classmethod
    def of(cls, trusted: Iterable[bytes] | RunSigners) -> RunSigners:
        return trusted if isinstance(trusted, RunSigners) else cls.for_every_kind(trusted)

    def union(self, other: RunSigners) -> RunSigners:
        return RunSigners(
            validators=self.validators | other.validators,
            trainers=self.trainers | other.trainers,
            services=self.services | other.services,
        )

    @property
    def everyone(self) -> frozenset[bytes]:
        """Every signer with a role: trusted in full for transfer and seed receipts."""
        return self.validators | self.trainers | self.services

    def trusts(self, kind: ReceiptKind, signer: bytes) -> bool:
        """Whether a receipt of `kind` signed by `signer` counts in full."""
        if kind is ReceiptKind.ROLLOUT:
            return signer in self.validators
        if kind in (ReceiptKind.TRAINING, ReceiptKind.VALIDATION):
            return signer in self.trainers
        return signer in self.everyone
