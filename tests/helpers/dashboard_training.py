"""Receipts for the dashboard's training panel: training receipts with the signer's loss, verdicts with a reward."""

from __future__ import annotations

import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import rollouts_pb2
from protocol.receipts import seal_training_receipt
from protocol.rollout_messages import seal_verdict
from tests.helpers.receipts import RUN


def training_round(
    members: dict[bytes, tuple[Ed25519PrivateKey, float]],
    *,
    step: int,
    tokens: int = 1000,
    bytes_exchanged: int = 4096,
    issued_at: float | None = None,
) -> list[bytes]:
    """The receipts of one averaging round: each member (PeerID -> key, its own loss) signs for every other."""
    round_id = os.urandom(16)
    return [
        seal_training_receipt(
            key,
            run_id=RUN,
            contributor=other,
            outer_step=step,
            round_id=round_id,
            tokens_trained=tokens,
            bytes_exchanged=bytes_exchanged,
            signer_loss=loss,
            issued_at=issued_at,
        )
        for signer, (key, loss) in members.items()
        for other in members
        if other != signer
    ]


def rewarded_verdict(
    validator: Ed25519PrivateKey,
    worker: bytes,
    *,
    version: int,
    reward: float,
    accepted: bool = True,
    tokens: int = 50,
    issued_at: float | None = None,
) -> bytes:
    """A validator's verdict on one rollout of policy `version` (a rejection carries reward 0)."""
    message = rollouts_pb2.RolloutVerdict(
        worker=worker, rollout_hash=os.urandom(32), policy_version=version, counter=1, index=0, tokens=tokens,
        accepted=accepted, reason="" if accepted else "stale", reward=reward if accepted else 0.0,
        issued_at=time.time() if issued_at is None else issued_at,
    )  # fmt: skip
    return seal_verdict(validator, run_id=RUN, verdict=message)
