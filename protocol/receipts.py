"""Contribution receipts: sealing each kind, and opening any of them into one typed `Receipt`.

A receipt is signed by whoever received the work, never by the contributor: a validator signs a
verdict per rollout (`RolloutVerdict`, domain "rollout-verdict", sealed and checked by
`protocol.rollout_messages.seal_verdict` / `check_verdict`), an averaging peer signs another
trainer's participation in an outer step ("receipt-training"), a fetcher signs what it received
from a source in the weight broadcast ("receipt-transfer"), a node signs a seed's bootstrap or
dial-back service ("receipt-seed") and a trainer signs a standalone validator's forward of a group
it verified ("receipt-validation"). Every receipt is an envelope (`protocol.envelope`), so it is
bound to the run and the protocol version, and it names its evidence (rollout hash, round id,
manifest hash, service session id, forwarded group hash). Each kind's payload fields and their
caps are checked by `protocol.receipt_fields`.

`open_receipt` verifies any of them strictly: canonical encoding, size caps, signature, run,
expiry, field caps, and refuses a receipt whose signer is its contributor (self-issued). The
receipt id is the sha256 of the envelope bytes; the canonical-encoding check makes it unique per
signed receipt. With `audit=True` a receipt is checked as it stood when issued, not against
today's clock, so an exported ledger can be re-verified long after its receipts expired.
`stored_payload` decodes the payload of a receipt that was verified when it was stored (figures
a `Receipt` does not carry: a verdict's reward or detail, a training receipt's signer loss).
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message

from protocol import hivenet_pb2
from protocol import receipts_pb2 as pb
from protocol.envelope import open_parsed, parse_envelope, seal
from protocol.errors import InvalidMessage
from protocol.limits import MAX_CLOCK_SKEW_S, MAX_RECEIPT_ENVELOPE_BYTES, RECEIPT_TTL_S
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipt_fields import (
    MAX_ROUND_ID_BYTES,
    MIN_SESSION_ID_BYTES,
    Fields,
    fields_of_seed,
    fields_of_training,
    fields_of_transfer,
    fields_of_validation,
    fields_of_verdict,
)
from protocol.rollout_messages import DOMAIN_VERDICT
from protocol.untrusted import capped_bytes, parse_untrusted

DOMAIN_TRAINING = "receipt-training"
DOMAIN_TRANSFER = "receipt-transfer"
DOMAIN_SEED = "receipt-seed"

DOMAIN_VALIDATION = "receipt-validation"

MAX_RECEIPT_BYTES = MAX_RECEIPT_ENVELOPE_BYTES
"""Largest receipt envelope accepted (the biggest, a verdict with its detail, is well under 1 KiB)."""


class ReceiptKind(enum.StrEnum):
    """What a receipt attests; each kind earns credit in one role."""

    ROLLOUT = "rollout"
    TRAINING = "training"
    TRANSFER = "transfer"
    SEED = "seed"
    VALIDATION = "validation"

    @property
    def role(self) -> str:
        return ROLE_OF_KIND[self]


ROLE_OF_KIND = {
    ReceiptKind.ROLLOUT: "inference",
    ReceiptKind.TRAINING: "trainer",
    ReceiptKind.TRANSFER: "broadcast",
    ReceiptKind.SEED: "seed",
    ReceiptKind.VALIDATION: "validator",
}
ROLES = tuple(ROLE_OF_KIND.values())

DOMAIN_OF_KIND = {
    ReceiptKind.ROLLOUT: DOMAIN_VERDICT,
    ReceiptKind.TRAINING: DOMAIN_TRAINING,
    ReceiptKind.TRANSFER: DOMAIN_TRANSFER,
    ReceiptKind.SEED: DOMAIN_SEED,
    ReceiptKind.VALIDATION: DOMAIN_VALIDATION,
}
KIND_OF_DOMAIN = {domain: kind for kind, domain in DOMAIN_OF_KIND.items()}


@dataclass(frozen=True, slots=True)
class Receipt:
    """A verified receipt. Amount fields a kind does not carry are 0.

    - rollout: `step` = policy version, `tokens` = completion tokens, `accepted`, `reason`.
    - training: `step` = outer step, `tokens` = tokens trained, `byte_count` = bytes exchanged
      (its `signer_loss`, checked here, is read from the envelope by whoever shows it).
    - transfer: `step` = weights version, `chunks`, `byte_count`.
    - seed: `step` = the `SeedService` value, `count` = requests served.
    - validation: `tokens` = completion tokens of the forwarded group, `count` = its rollouts.
    """

    receipt_id: bytes
    """sha256 of `envelope`."""
    kind: ReceiptKind
    signer: bytes
    contributor: bytes
    run_id: str
    evidence: bytes
    """Rollout hash, round id, manifest hash, service session id or forwarded group hash."""
    issued_at: float
    step: int = 0
    tokens: int = 0
    byte_count: int = 0
    chunks: int = 0
    count: int = 0
    accepted: bool = True
    reason: str = ""
    envelope: bytes = b""
    """The raw signed envelope; empty when a ledger loaded the receipt without it."""

    @property
    def role(self) -> str:
        return ROLE_OF_KIND[self.kind]


def receipt_id(envelope: bytes) -> bytes:
    """The id of a receipt: sha256 of its envelope bytes."""
    return hashlib.sha256(envelope).digest()


# --- sealing ---


def _seal(
    private_key: Ed25519PrivateKey, kind: ReceiptKind, run_id: str, payload: bytes, issued_at: float
) -> bytes:
    # the receiver's field checks, so that a node never signs a receipt others would refuse
    fields = _FIELDS_OF_KIND[kind](payload)
    if fields["contributor"] == peer_id_from_private_key(private_key):
        raise InvalidMessage("a node cannot sign a receipt for its own work")
    return seal(
        private_key,
        domain=DOMAIN_OF_KIND[kind],
        run_id=run_id,
        payload=payload,
        expires_at=issued_at + RECEIPT_TTL_S,
        seq=0,
    )


def _issued(issued_at: float | None) -> float:
    return time.time() if issued_at is None else issued_at


def seal_training_receipt(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    contributor: bytes,
    outer_step: int,
    round_id: bytes,
    tokens_trained: int,
    bytes_exchanged: int,
    signer_loss: float = 0.0,
    issued_at: float | None = None,
) -> bytes:
    """Attest that trainer `contributor` averaged with the signer in `outer_step` (round `round_id`).

    `signer_loss` is the signer's own mean training loss over the step's inner steps (0: not
    reported); InvalidMessage unless it is finite and non-negative.
    """
    issued = _issued(issued_at)
    payload = pb.TrainingReceipt(
        contributor=contributor,
        outer_step=outer_step,
        round_id=round_id,
        tokens_trained=tokens_trained,
        bytes_exchanged=bytes_exchanged,
        issued_at=issued,
        signer_loss=signer_loss,
    ).SerializeToString()
    return _seal(private_key, ReceiptKind.TRAINING, run_id, payload, issued)


def seal_transfer_receipt(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    contributor: bytes,
    version: int,
    manifest_hash: bytes,
    chunks: int,
    byte_count: int,
    issued_at: float | None = None,
) -> bytes:
    """Attest that the signer received `chunks` verified chunks (`byte_count` bytes) of a version from `contributor`."""
    issued = _issued(issued_at)
    payload = pb.TransferReceipt(
        contributor=contributor,
        version=version,
        manifest_hash=manifest_hash,
        chunks=chunks,
        byte_count=byte_count,
        issued_at=issued,
    ).SerializeToString()
    return _seal(private_key, ReceiptKind.TRANSFER, run_id, payload, issued)


def seal_seed_receipt(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    contributor: bytes,
    service: pb.SeedService,
    session_id: bytes,
    count: int = 1,
    issued_at: float | None = None,
) -> bytes:
    """Attest that seed `contributor` served the signer (`service` is a `SeedService` value)."""
    issued = _issued(issued_at)
    payload = pb.SeedServiceReceipt(
        contributor=contributor, service=service, session_id=session_id, count=count, issued_at=issued
    ).SerializeToString()
    return _seal(private_key, ReceiptKind.SEED, run_id, payload, issued)


def seal_validation_receipt(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    contributor: bytes,
    group_hash: bytes,
    rollouts: int,
    tokens: int,
    issued_at: float | None = None,
) -> bytes:
    """Attest that the signer, a trainer, took the group (sha256 `group_hash` of the worker's sealed
    group) that validator `contributor` verified and forwarded: `rollouts` rollouts holding `tokens`
    completion tokens, both counted by the signer from the group it checked."""
    issued = _issued(issued_at)
    payload = pb.ValidationReceipt(
        contributor=contributor, group_hash=group_hash, rollouts=rollouts, tokens=tokens, issued_at=issued
    ).SerializeToString()
    return _seal(private_key, ReceiptKind.VALIDATION, run_id, payload, issued)


# --- opening ---


_FIELDS_OF_KIND: dict[ReceiptKind, Callable[[bytes], Fields]] = {
    ReceiptKind.ROLLOUT: fields_of_verdict,
    ReceiptKind.TRAINING: fields_of_training,
    ReceiptKind.TRANSFER: fields_of_transfer,
    ReceiptKind.SEED: fields_of_seed,
    ReceiptKind.VALIDATION: fields_of_validation,
}


def open_receipt(
    data: object,
    *,
    run_id: str | None = None,
    kinds: frozenset[ReceiptKind] | None = None,
    now: float | None = None,
    audit: bool = False,
) -> Receipt:
    """Verify an untrusted receipt envelope of any kind and return it typed.

    Raises InvalidMessage if it is not canonical, oversized, malformed, of an unknown domain or a
    kind outside `kinds`, of another run or protocol version, badly signed, self-issued, out of
    its field caps, issued after its expiry or valid for longer than `RECEIPT_TTL_S`, and (unless
    `audit`) expired or issued in the future at `now`.
    """
    data = capped_bytes(data, MAX_RECEIPT_BYTES, "receipt")
    outer, body = parse_envelope(data, MAX_RECEIPT_BYTES, "receipt envelope")
    if hivenet_pb2.SignedEnvelope(body=outer.body, signature=outer.signature).SerializeToString() != data:
        raise InvalidMessage("receipt envelope is not canonically encoded")
    kind = KIND_OF_DOMAIN.get(body.domain)
    if kind is None:
        raise InvalidMessage(f"{body.domain!r} is not a receipt")
    if kinds is not None and kind not in kinds:
        raise InvalidMessage(f"{kind} receipts are not accepted here")

    clock = time.time() if now is None else now
    # an audit checks the receipt as of its own expiry: every signature and context check, no clock
    envelope = open_parsed(
        outer,
        body,
        domain=body.domain,
        run_id=run_id,
        now=body.expires_at if audit else clock,
        max_ttl_s=None if audit else RECEIPT_TTL_S,
    )
    fields = _FIELDS_OF_KIND[kind](envelope.payload)
    issued_at = fields["issued_at"]
    assert isinstance(issued_at, float)
    if not issued_at <= envelope.expires_at + MAX_CLOCK_SKEW_S:
        raise InvalidMessage("receipt was issued after its own expiry")
    if not envelope.expires_at <= issued_at + RECEIPT_TTL_S + MAX_CLOCK_SKEW_S:
        raise InvalidMessage(f"receipt claims validity beyond {RECEIPT_TTL_S:.0f} s after issue")
    if not audit and not issued_at <= clock + MAX_CLOCK_SKEW_S:
        raise InvalidMessage("receipt is issued in the future")
    if fields["contributor"] == envelope.signer:
        raise InvalidMessage("receipt is self-issued: a contributor cannot sign for its own work")
    return Receipt(
        receipt_id=receipt_id(data),
        kind=kind,
        signer=envelope.signer,
        run_id=envelope.run_id,
        envelope=data,
        **fields,  # type: ignore[arg-type]
    )


M = TypeVar("M", bound=Message)


def stored_payload(envelope: bytes, message: type[M]) -> M | None:
    """The payload of a receipt envelope verified when it was stored (`open_receipt`), decoded as
    `message`; None if it does not decode. It checks nothing else: only for receipts a ledger holds."""
    try:
        outer = parse_untrusted(hivenet_pb2.SignedEnvelope, envelope, "receipt envelope")
        body = parse_untrusted(hivenet_pb2.EnvelopeBody, outer.body, "receipt envelope body")
        return parse_untrusted(message, body.payload, "receipt payload")
    except InvalidMessage:
        return None


__all__ = [
    "DOMAIN_SEED",
    "DOMAIN_TRAINING",
    "DOMAIN_TRANSFER",
    "DOMAIN_VALIDATION",
    "DOMAIN_VERDICT",
    "MAX_RECEIPT_BYTES",
    "MAX_ROUND_ID_BYTES",
    "MIN_SESSION_ID_BYTES",
    "RECEIPT_TTL_S",
    "ROLES",
    "ROLE_OF_KIND",
    "Receipt",
    "ReceiptKind",
    "open_receipt",
    "receipt_id",
    "seal_seed_receipt",
    "seal_training_receipt",
    "seal_transfer_receipt",
    "seal_validation_receipt",
    "stored_payload",
]
