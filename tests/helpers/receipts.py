"""Receipts for tests: one line to seal a receipt of each kind with sensible defaults."""

from __future__ import annotations

import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import receipts_pb2, rollouts_pb2
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import (
    seal_seed_receipt,
    seal_training_receipt,
    seal_transfer_receipt,
    seal_validation_receipt,
)
from protocol.rollout_messages import seal_verdict

RUN = "run-receipts"


def new_peer() -> tuple[Ed25519PrivateKey, bytes]:
    """A fresh key and its PeerID bytes."""
    key = Ed25519PrivateKey.generate()
    return key, peer_id_from_private_key(key)


def verdict(
    validator: Ed25519PrivateKey,
    worker: bytes,
    *,
    tokens: int = 100,
    accepted: bool = True,
    reason: str = "",
    rollout_hash: bytes | None = None,
    issued_at: float | None = None,
    run_id: str = RUN,
    ban_s: float = 0.0,
) -> bytes:
    """A validator's verdict; `ban_s` > 0: a rejection that banned the worker for that long."""
    issued_at = time.time() if issued_at is None else issued_at
    message = rollouts_pb2.RolloutVerdict(
        worker=worker,
        rollout_hash=rollout_hash or os.urandom(32),
        policy_version=3,
        counter=7,
        index=0,
        tokens=tokens,
        accepted=accepted,
        reason=reason,
        reward=0.5 if accepted else 0.0,
        issued_at=issued_at,
        banned_until=issued_at + ban_s if ban_s else 0.0,
    )
    return seal_verdict(validator, run_id=run_id, verdict=message)


def training(
    signer: Ed25519PrivateKey,
    contributor: bytes,
    *,
    tokens: int = 1000,
    round_id: bytes | None = None,
    issued_at: float | None = None,
    run_id: str = RUN,
) -> bytes:
    return seal_training_receipt(
        signer,
        run_id=run_id,
        contributor=contributor,
        outer_step=5,
        round_id=round_id or os.urandom(16),
        tokens_trained=tokens,
        bytes_exchanged=4096,
        issued_at=issued_at,
    )


def transfer(
    signer: Ed25519PrivateKey,
    contributor: bytes,
    *,
    byte_count: int = 1 << 20,
    issued_at: float | None = None,
    run_id: str = RUN,
    version: int = 2,
) -> bytes:
    return seal_transfer_receipt(
        signer,
        run_id=run_id,
        contributor=contributor,
        version=version,
        manifest_hash=os.urandom(32),
        chunks=4,
        byte_count=byte_count,
        issued_at=issued_at,
    )


def seed(
    signer: Ed25519PrivateKey, contributor: bytes, *, issued_at: float | None = None, run_id: str = RUN
) -> bytes:
    return seal_seed_receipt(
        signer,
        run_id=run_id,
        contributor=contributor,
        service=receipts_pb2.SEED_SERVICE_BOOTSTRAP,
        session_id=os.urandom(16),
        issued_at=issued_at,
    )


def validation(
    trainer: Ed25519PrivateKey,
    validator: bytes,
    *,
    tokens: int = 400,
    rollouts: int = 4,
    group_hash: bytes | None = None,
    issued_at: float | None = None,
    run_id: str = RUN,
) -> bytes:
    """A trainer's validation receipt for a group `validator` forwarded."""
    return seal_validation_receipt(
        trainer,
        run_id=run_id,
        contributor=validator,
        group_hash=group_hash or os.urandom(32),
        rollouts=rollouts,
        tokens=tokens,
        issued_at=issued_at,
    )
