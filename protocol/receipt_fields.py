"""The fields of each kind of receipt payload, decoded from untrusted bytes and checked strictly.

One `fields_of_*` function per kind (`protocol.receipts` maps each kind to its function): it
decodes the payload and returns the fields a `protocol.receipts.Receipt` carries, or raises
InvalidMessage when a field is out of its size or count cap. The same checks run when a node
seals a receipt, so that it never signs one that others would refuse.
"""

from __future__ import annotations

import math

from protocol import receipts_pb2 as pb
from protocol import rollouts_pb2
from protocol.errors import InvalidMessage
from protocol.limits import MAX_ROLLOUT_COMPLETION_TOKENS, MAX_ROLLOUTS_PER_GROUP
from protocol.peer_keys import check_ed25519_peer_id
from protocol.rollout_messages import check_verdict
from protocol.untrusted import parse_untrusted

__all__ = [
    "HASH_BYTES",
    "MAX_BYTES",
    "MAX_CHUNKS",
    "MAX_PEER_ID_BYTES",
    "MAX_ROUND_ID_BYTES",
    "MAX_SERVICE_COUNT",
    "MAX_SESSION_ID_BYTES",
    "MAX_TOKENS",
    "MIN_SESSION_ID_BYTES",
    "Fields",
    "fields_of_seed",
    "fields_of_training",
    "fields_of_transfer",
    "fields_of_validation",
    "fields_of_verdict",
]

MAX_PEER_ID_BYTES = 64
MAX_ROUND_ID_BYTES = 64
MAX_SESSION_ID_BYTES = 64
MIN_SESSION_ID_BYTES = 16
HASH_BYTES = 32
MAX_TOKENS = 1 << 40
"""Cap on any token count in a receipt (far above any real outer step or rollout)."""
MAX_BYTES = 1 << 50
MAX_CHUNKS = 1 << 24
MAX_SERVICE_COUNT = 1 << 20

Fields = dict[str, object]


def _check_peer_id(value: bytes, what: str) -> bytes:
    if not 0 < len(value) <= MAX_PEER_ID_BYTES:
        raise InvalidMessage(f"receipt {what} is {len(value)} bytes, expected a PeerID")
    check_ed25519_peer_id(value)  # only Ed25519 PeerIDs name a peer that can sign
    return value


def _check_id(value: bytes, what: str, low: int, high: int) -> bytes:
    if not low <= len(value) <= high:
        size = str(low) if low == high else f"{low}-{high}"
        raise InvalidMessage(f"receipt {what} is {len(value)} bytes, expected {size}")
    return value


def _check_count(value: int, cap: int, what: str) -> int:
    if value > cap:
        raise InvalidMessage(f"receipt {what} {value} exceeds the cap of {cap}")
    return value


def _check_time(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise InvalidMessage(f"receipt issue time {value!r} is not a valid unix time")
    return value


def _check_loss(value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise InvalidMessage(f"receipt signer loss {value!r} is not a finite non-negative number")
    return value


def fields_of_verdict(payload: bytes) -> Fields:
    verdict = parse_untrusted(rollouts_pb2.RolloutVerdict, payload, "rollout verdict")
    check_verdict(verdict)  # the transport's own check: a ledger admits what workers accept
    return dict(
        contributor=_check_peer_id(verdict.worker, "worker"),
        evidence=_check_id(verdict.rollout_hash, "rollout hash", HASH_BYTES, HASH_BYTES),
        issued_at=_check_time(verdict.issued_at),
        step=verdict.policy_version,
        tokens=_check_count(verdict.tokens, MAX_TOKENS, "tokens"),
        accepted=verdict.accepted,
        reason=verdict.reason,
    )


def fields_of_training(payload: bytes) -> Fields:
    message = parse_untrusted(pb.TrainingReceipt, payload, "training receipt")
    _check_loss(message.signer_loss)  # not a `Receipt` field: the dashboard decodes it from the envelope
    return dict(
        contributor=_check_peer_id(message.contributor, "contributor"),
        evidence=_check_id(message.round_id, "round id", 1, MAX_ROUND_ID_BYTES),
        issued_at=_check_time(message.issued_at),
        step=message.outer_step,
        tokens=_check_count(message.tokens_trained, MAX_TOKENS, "tokens trained"),
        byte_count=_check_count(message.bytes_exchanged, MAX_BYTES, "bytes exchanged"),
    )


def fields_of_transfer(payload: bytes) -> Fields:
    message = parse_untrusted(pb.TransferReceipt, payload, "transfer receipt")
    return dict(
        contributor=_check_peer_id(message.contributor, "contributor"),
        evidence=_check_id(message.manifest_hash, "manifest hash", HASH_BYTES, HASH_BYTES),
        issued_at=_check_time(message.issued_at),
        step=message.version,
        chunks=_check_count(message.chunks, MAX_CHUNKS, "chunks"),
        byte_count=_check_count(message.byte_count, MAX_BYTES, "bytes"),
    )


def fields_of_seed(payload: bytes) -> Fields:
    message = parse_untrusted(pb.SeedServiceReceipt, payload, "seed service receipt")
    if message.service not in (pb.SEED_SERVICE_BOOTSTRAP, pb.SEED_SERVICE_DIAL_BACK):
        raise InvalidMessage(f"seed service receipt names an unknown service {message.service}")
    return dict(
        contributor=_check_peer_id(message.contributor, "contributor"),
        evidence=_check_id(message.session_id, "session id", MIN_SESSION_ID_BYTES, MAX_SESSION_ID_BYTES),
        issued_at=_check_time(message.issued_at),
        step=message.service,
        count=_check_count(message.count, MAX_SERVICE_COUNT, "service count"),
    )


def fields_of_validation(payload: bytes) -> Fields:
    """A group holds 1..MAX_ROLLOUTS_PER_GROUP rollouts of 1..MAX_ROLLOUT_COMPLETION_TOKENS
    completion tokens each: a receipt outside those bounds attests no group a trainer could take."""
    message = parse_untrusted(pb.ValidationReceipt, payload, "validation receipt")
    if not 1 <= message.rollouts <= MAX_ROLLOUTS_PER_GROUP:
        raise InvalidMessage(
            f"validation receipt counts {message.rollouts} rollouts, expected 1..{MAX_ROLLOUTS_PER_GROUP}"
        )
    most = message.rollouts * MAX_ROLLOUT_COMPLETION_TOKENS
    if not message.rollouts <= message.tokens <= most:
        raise InvalidMessage(
            f"validation receipt counts {message.tokens} tokens for {message.rollouts} rollouts, "
            f"expected {message.rollouts}..{most}"
        )
    return dict(
        contributor=_check_peer_id(message.contributor, "contributor"),
        evidence=_check_id(message.group_hash, "group hash", HASH_BYTES, HASH_BYTES),
        issued_at=_check_time(message.issued_at),
        tokens=message.tokens,
        count=message.rollouts,
    )
