"""Sealing and strict opening of the rollout transport's messages: groups, verdicts, forwards.

* A worker seals one `RolloutGroup` per assignment (domain `DOMAIN_GROUP`, signer = worker).
* A validator seals one `RolloutVerdict` per rollout (domain `DOMAIN_VERDICT`, signer = validator):
  the worker's receipt, valid for `RECEIPT_TTL_S` like every receipt, so the same bytes open
  with `open_verdict` (workers, trainers) and `protocol.receipts.open_receipt` (ledgers).
* A standalone validator hands a verified group to a trainer in a `RolloutForward` (domain
  `DOMAIN_FORWARD`, signer = validator) that carries the worker's sealed group and the
  validator's sealed verdicts unchanged; `open_forward` re-checks every signature and binding.

Everything opened here is untrusted: sizes are capped before decoding, every field is checked
against `protocol.limits` (rollouts per group, tokens, proofs per rollout and their size, dtype,
finite sampling parameters in range), and any failure is one `InvalidMessage` with a reason.
The caps are structural; whether a rollout is *right* is the validator's judgement.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import DecodeError

from protocol import rollout_forward_pb2 as fpb
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope, open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_ENVELOPE_BYTES,
    MAX_ROLLOUT_COMPLETION_TOKENS,
    MAX_ROLLOUT_FORWARD_BYTES,
    MAX_ROLLOUT_GROUP_BYTES,
    MAX_ROLLOUT_PROMPT_TOKENS,
    MAX_ROLLOUT_PROOF_BYTES,
    MAX_ROLLOUT_TEMPERATURE,
    MAX_ROLLOUT_TOKEN_ID,
    MAX_ROLLOUTS_PER_GROUP,
    MAX_TASK_NAME_CHARS,
    MAX_VERDICT_BAN_S,
    MAX_VERDICT_DETAIL_CHARS,
    MAX_VERDICT_REASON_CHARS,
    MIN_ROLLOUT_PROOF_BYTES,
    RECEIPT_TTL_S,
    ROLLOUT_FORWARD_TTL_S,
    ROLLOUT_GROUP_TTL_S,
)
from protocol.peer_keys import Signer, check_ed25519_peer_id
from protocol.text import REASON_PATTERN, printable_text
from protocol.toploc import CHUNK_TOKENS, num_chunks
from protocol.untrusted import capped_bytes, parse_untrusted

__all__ = [
    "ABANDONED",
    "BANNED",
    "DOMAIN_FORWARD",
    "DOMAIN_GROUP",
    "DOMAIN_VERDICT",
    "GROUP_SIZE",
    "ROLLOUT_DTYPES",
    "STALE",
    "UNKNOWN_VERSION",
    "WRONG_VERSION",
    "Forwarded",
    "check_group",
    "check_verdict",
    "check_verdicts_match",
    "group_hash",
    "open_forward",
    "open_group",
    "open_verdict",
    "parse_rollout",
    "rollout_hash",
    "seal_forward",
    "seal_group",
    "seal_verdict",
]

DOMAIN_GROUP = "rollout-group"
DOMAIN_VERDICT = "rollout-verdict"
DOMAIN_FORWARD = "rollout-forward"

ROLLOUT_DTYPES = frozenset({"float32", "bfloat16", "float16"})
"""Precisions a worker may claim (the names of `verification.rollout.CLAIM_DTYPES`)."""

UNKNOWN_VERSION = "unknown_version"
"""The verdict reason of a group whose policy version the validator does not hold (yet): nothing was
judged or used up, and the worker may submit the group again, there or elsewhere."""

BANNED = "banned"
"""The verdict reason of every rollout from a worker the validator has banned (for a while)."""

GROUP_SIZE = "group_size"
"""The verdict reason of every rollout of a group whose size is not the run's (a worker started with
another --group-size than the run's)."""

STALE = "stale"
"""The verdict reason of a rollout whose policy version is older than the validator accepts."""

WRONG_VERSION = "wrong_version"
"""The verdict reason of a group generated with another policy version than its ticket fixes."""

ABANDONED = "abandoned"
"""The verdict reason of a ticket the worker let expire unused (its verdict names the ticket, not a
rollout: `verification.tickets.ticket_evidence`)."""

_MAX_ROLLOUT_BYTES = (
    (MAX_ROLLOUT_PROMPT_TOKENS + MAX_ROLLOUT_COMPLETION_TOKENS) * 6
    + num_chunks(MAX_ROLLOUT_COMPLETION_TOKENS) * (MAX_ROLLOUT_PROOF_BYTES + 4)
    + 256
)
"""Largest serialized Rollout that can satisfy the caps (varint token ids, proofs, small fields)."""

_SHA256_BYTES = 32


def rollout_hash(rollout_bytes: bytes) -> bytes:
    """How a verdict, a replay check and a ledger name a rollout: sha256 of its canonical content.

    The content is every known field but the proofs (tokens, seed, sampling, precision, device),
    re-encoded deterministically: fields the protocol does not know are dropped, so that no encoding
    a worker may choose (unknown fields, unpacked or reordered fields, a field repeated) and no
    other proof of the same tokens gives the same rollout a second name, and a second credit. Bytes
    that do not decode are named by their own hash (their verdict is a rejection).
    """
    try:
        rollout = rpb.Rollout.FromString(rollout_bytes)
    except DecodeError:
        return hashlib.sha256(b"hivenet-undecodable-rollout\0" + rollout_bytes).digest()
    rollout.DiscardUnknownFields()
    rollout.ClearField("proofs")
    return hashlib.sha256(
        b"hivenet-rollout-content\0" + rollout.SerializeToString(deterministic=True)
    ).digest()


def _check_tokens(ids: object, what: str, limit: int) -> None:
    count = len(ids)  # type: ignore[arg-type]
    if not 1 <= count <= limit:
        raise InvalidMessage(f"rollout has {count} {what} tokens, expected 1..{limit}")
    if max(ids) > MAX_ROLLOUT_TOKEN_ID:  # type: ignore[call-overload]
        raise InvalidMessage(f"rollout has a {what} token id above {MAX_ROLLOUT_TOKEN_ID}")


def parse_rollout(data: bytes) -> rpb.Rollout:
    """Decode one untrusted serialized Rollout and check its structure; InvalidMessage otherwise.

    Checks: 1..MAX_ROLLOUT_PROMPT_TOKENS prompt tokens, 1..MAX_ROLLOUT_COMPLETION_TOKENS completion
    tokens, token ids in range, a dtype of `ROLLOUT_DTYPES`, a finite temperature in
    (0, MAX_ROLLOUT_TEMPERATURE] and top_p in (0, 1], and exactly one proof per 32 completion
    tokens, each of MIN_ROLLOUT_PROOF_BYTES..MAX_ROLLOUT_PROOF_BYTES bytes.
    """
    data = capped_bytes(data, _MAX_ROLLOUT_BYTES, "rollout")
    rollout = parse_untrusted(rpb.Rollout, data, "rollout")
    _check_tokens(rollout.prompt_ids, "prompt", MAX_ROLLOUT_PROMPT_TOKENS)
    _check_tokens(rollout.completion_ids, "completion", MAX_ROLLOUT_COMPLETION_TOKENS)
    if rollout.dtype not in ROLLOUT_DTYPES:
        raise InvalidMessage(
            f"rollout claims dtype {rollout.dtype[:32]!r}, expected one of {sorted(ROLLOUT_DTYPES)}"
        )
    # written as `not (in range)` so that NaN, for which every comparison is False, is refused
    if not (math.isfinite(rollout.temperature) and 0.0 < rollout.temperature <= MAX_ROLLOUT_TEMPERATURE):
        raise InvalidMessage(
            f"rollout temperature {rollout.temperature} is not in (0, {MAX_ROLLOUT_TEMPERATURE}]"
        )
    if not (math.isfinite(rollout.top_p) and 0.0 < rollout.top_p <= 1.0):
        raise InvalidMessage(f"rollout top_p {rollout.top_p} is not in (0, 1]")
    expected = num_chunks(len(rollout.completion_ids))
    if len(rollout.proofs) != expected:
        raise InvalidMessage(
            f"rollout has {len(rollout.proofs)} proofs for {len(rollout.completion_ids)} completion tokens, "
            f"expected {expected} (one per {CHUNK_TOKENS} tokens)"
        )
    for i, proof in enumerate(rollout.proofs):
        if not MIN_ROLLOUT_PROOF_BYTES <= len(proof) <= MAX_ROLLOUT_PROOF_BYTES:
            raise InvalidMessage(
                f"proof {i} is {len(proof)} bytes, expected {MIN_ROLLOUT_PROOF_BYTES}..{MAX_ROLLOUT_PROOF_BYTES}"
            )
    return rollout


def check_group(group: rpb.RolloutGroup) -> list[rpb.Rollout]:
    """Check a decoded group's structure and parse each of its rollouts; InvalidMessage otherwise."""
    if not 1 <= len(group.rollouts) <= MAX_ROLLOUTS_PER_GROUP:
        raise InvalidMessage(
            f"group holds {len(group.rollouts)} rollouts, expected 1..{MAX_ROLLOUTS_PER_GROUP}"
        )
    if not 1 <= len(group.task) <= MAX_TASK_NAME_CHARS:
        raise InvalidMessage(f"group task name must be 1..{MAX_TASK_NAME_CHARS} characters")
    rollouts = []
    for i, data in enumerate(group.rollouts):
        try:
            rollouts.append(parse_rollout(data))
        except InvalidMessage as exc:
            raise InvalidMessage(f"rollout {i} of the group: {exc}") from None
    return rollouts


def seal_group(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    group: rpb.RolloutGroup,
    seq: int,
    now: float | None = None,
) -> bytes:
    """The worker's signed envelope of `group` (valid for ROLLOUT_GROUP_TTL_S); InvalidMessage if over a cap."""
    check_group(group)
    now = time.time() if now is None else now
    return seal(
        private_key,
        domain=DOMAIN_GROUP,
        run_id=run_id,
        payload=group.SerializeToString(),
        expires_at=now + ROLLOUT_GROUP_TTL_S,
        seq=seq,
        max_bytes=MAX_ROLLOUT_GROUP_BYTES,
    )


def open_group(
    data: object, *, run_id: str, signer: bytes | None = None, now: float | None = None
) -> tuple[Envelope, rpb.RolloutGroup]:
    """Verify an untrusted sealed group of `run_id` (signed by `signer` if given) and check every cap.

    Raises InvalidMessage if the envelope is not bytes, over MAX_ROLLOUT_GROUP_BYTES, malformed,
    of another domain or run, badly signed, expired or valid for longer than ROLLOUT_GROUP_TTL_S,
    or if the group or any of its rollouts breaks a cap (see `check_group`, `parse_rollout`).
    """
    envelope = open_envelope(
        data,
        domain=DOMAIN_GROUP,
        run_id=run_id,
        signer=signer,
        max_ttl_s=ROLLOUT_GROUP_TTL_S,
        now=now,
        max_bytes=MAX_ROLLOUT_GROUP_BYTES,
    )
    group = parse_untrusted(rpb.RolloutGroup, envelope.payload, "rollout group")
    check_group(group)
    return envelope, group


def check_verdict(verdict: rpb.RolloutVerdict) -> None:
    """InvalidMessage unless every field of a decoded verdict is in range (see `open_verdict`)."""
    check_ed25519_peer_id(verdict.worker)
    if len(verdict.rollout_hash) != _SHA256_BYTES:
        raise InvalidMessage(
            f"verdict rollout_hash is {len(verdict.rollout_hash)} bytes, expected {_SHA256_BYTES}"
        )
    if verdict.index >= MAX_ROLLOUTS_PER_GROUP:
        raise InvalidMessage(
            f"verdict index {verdict.index} is beyond the {MAX_ROLLOUTS_PER_GROUP}-rollout cap"
        )
    if verdict.tokens > MAX_ROLLOUT_COMPLETION_TOKENS:
        raise InvalidMessage(f"verdict counts {verdict.tokens} tokens, above {MAX_ROLLOUT_COMPLETION_TOKENS}")
    if len(verdict.reason) > MAX_VERDICT_REASON_CHARS or len(verdict.detail) > MAX_VERDICT_DETAIL_CHARS:
        raise InvalidMessage("verdict reason or detail is too long")
    if verdict.reason and not REASON_PATTERN.fullmatch(verdict.reason):
        raise InvalidMessage("a verdict reason is a snake_case word (letters, digits, underscores)")
    if not verdict.detail.isprintable():
        raise InvalidMessage("a verdict detail holds characters that do not print as themselves")
    if verdict.accepted == bool(verdict.reason):
        raise InvalidMessage("a verdict has a reason exactly when it rejects")
    if not (math.isfinite(verdict.reward) and 0.0 <= verdict.reward <= 1.0):
        raise InvalidMessage(f"verdict reward {verdict.reward} is not in [0, 1]")
    if not verdict.accepted and verdict.reward != 0.0:
        raise InvalidMessage("a rejecting verdict must carry reward 0")
    if not math.isfinite(verdict.issued_at):
        raise InvalidMessage("verdict issued_at is not finite")
    if verdict.banned_until and (
        verdict.accepted
        # written as `not (in range)` so that NaN, for which every comparison is False, is refused
        or not verdict.issued_at < verdict.banned_until <= verdict.issued_at + MAX_VERDICT_BAN_S
    ):
        raise InvalidMessage(
            f"verdict banned_until {verdict.banned_until} must follow a rejection, after its issue time"
            f" and within {MAX_VERDICT_BAN_S:.0f} s of it"
        )


def seal_verdict(
    private_key: Ed25519PrivateKey | Signer, *, run_id: str, verdict: rpb.RolloutVerdict, seq: int = 0
) -> bytes:
    """The validator's signed receipt for one rollout, valid for RECEIPT_TTL_S from `verdict.issued_at`.

    A detail longer than MAX_VERDICT_DETAIL_CHARS is cut and any character that would not print
    as itself (controls, newlines) is replaced by `?` (the caller's message is left as it was);
    any other field out of range (`check_verdict`) raises InvalidMessage, so a validator
    never signs a verdict that workers or ledgers would refuse for its fields. (A ledger also
    refuses a verdict on the signer's own work; workers do not, so sealing allows it.)
    """
    detail = printable_text(verdict.detail[:MAX_VERDICT_DETAIL_CHARS])
    if detail != verdict.detail:
        trimmed = rpb.RolloutVerdict()
        trimmed.CopyFrom(verdict)
        trimmed.detail = detail
        verdict = trimmed
    check_verdict(verdict)
    return seal(
        private_key,
        domain=DOMAIN_VERDICT,
        run_id=run_id,
        payload=verdict.SerializeToString(),
        expires_at=verdict.issued_at + RECEIPT_TTL_S,
        seq=seq,
    )


def open_verdict(
    data: object, *, run_id: str, validator: bytes | None = None, now: float | None = None
) -> tuple[Envelope, rpb.RolloutVerdict]:
    """Verify an untrusted sealed verdict of `run_id`, signed by `validator` (PeerID bytes) if given.

    Raises InvalidMessage for anything `open_envelope` refuses (size, domain, run, signer,
    signature, expiry) and for a verdict whose fields are out of range: a worker that is not an
    Ed25519 PeerID, a hash that is not 32 bytes, an index or token count beyond the caps, a reason
    present on an acceptance or missing on a rejection, a reward outside [0, 1] (or non-zero on a
    rejection), or a non-finite issue time.
    """
    envelope = open_envelope(
        data, domain=DOMAIN_VERDICT, run_id=run_id, signer=validator, max_ttl_s=RECEIPT_TTL_S, now=now
    )
    verdict = parse_untrusted(rpb.RolloutVerdict, envelope.payload, "rollout verdict")
    check_verdict(verdict)
    return envelope, verdict


def check_verdicts_match(
    group_signer: bytes, group: rpb.RolloutGroup, verdicts: list[rpb.RolloutVerdict]
) -> None:
    """InvalidMessage unless `verdicts` are one per rollout of `group`, in order, about that group."""
    if len(verdicts) != len(group.rollouts):
        raise InvalidMessage(f"{len(verdicts)} verdicts for a group of {len(group.rollouts)} rollouts")
    for i, (verdict, rollout) in enumerate(zip(verdicts, group.rollouts, strict=True)):
        if verdict.index != i:
            raise InvalidMessage(f"verdict {i} names rollout {verdict.index}")
        if verdict.worker != group_signer:
            raise InvalidMessage(f"verdict {i} names another worker than the group's signer")
        if verdict.policy_version != group.policy_version or verdict.counter != group.counter:
            raise InvalidMessage(f"verdict {i} names another policy version or counter than the group")
        if verdict.rollout_hash != rollout_hash(rollout):
            raise InvalidMessage(f"verdict {i} names another rollout (rollout_hash mismatch)")


@dataclass(frozen=True)
class Forwarded:
    """A forward whose every signature and binding was checked (see `open_forward`)."""

    envelope: Envelope
    """The forward's own envelope (signer = the forwarding validator)."""
    group_envelope: Envelope
    """The worker's envelope of the group (signer = the worker)."""
    group: rpb.RolloutGroup
    verdict_envelopes: tuple[bytes, ...]
    """The validator's sealed verdicts as received (the receipts), one per rollout."""
    verdicts: tuple[rpb.RolloutVerdict, ...]
    sealed_group: bytes = b""
    """The worker's sealed group exactly as forwarded."""

    @property
    def group_hash(self) -> bytes:
        """sha256 of the worker's sealed group as forwarded: what names it in a validation receipt."""
        return group_hash(self.sealed_group)


def group_hash(sealed_group: bytes) -> bytes:
    """How a validation receipt names a forwarded group: sha256 of the worker's sealed group bytes."""
    return hashlib.sha256(sealed_group).digest()


def seal_forward(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    sealed_group: bytes,
    sealed_verdicts: list[bytes],
    seq: int = 0,
    now: float | None = None,
) -> bytes:
    """The validator's signed forward of a worker's sealed group and its own sealed verdicts."""
    now = time.time() if now is None else now
    payload = fpb.RolloutForward(group=sealed_group, verdicts=sealed_verdicts).SerializeToString()
    return seal(
        private_key,
        domain=DOMAIN_FORWARD,
        run_id=run_id,
        payload=payload,
        expires_at=now + ROLLOUT_FORWARD_TTL_S,
        seq=seq,
        max_bytes=MAX_ROLLOUT_FORWARD_BYTES,
    )


def open_forward(
    data: object, *, run_id: str, validator: bytes | None = None, now: float | None = None
) -> Forwarded:
    """Verify an untrusted forward of `run_id` from `validator` and everything it carries.

    Raises InvalidMessage unless: the forward is signed by `validator` (if given); the group opens
    (`open_group`); there is exactly one verdict per rollout, in order, each signed by the same
    validator as the forward (`open_verdict`), naming the group's signer as its worker, the group's
    policy version and counter, and the sha256 of the rollout at its index.
    """
    envelope = open_envelope(
        data,
        domain=DOMAIN_FORWARD,
        run_id=run_id,
        signer=validator,
        max_ttl_s=ROLLOUT_FORWARD_TTL_S,
        now=now,
        max_bytes=MAX_ROLLOUT_FORWARD_BYTES,
    )
    forward = parse_untrusted(fpb.RolloutForward, envelope.payload, "rollout forward")
    if len(forward.verdicts) > MAX_ROLLOUTS_PER_GROUP:
        raise InvalidMessage(
            f"forward carries {len(forward.verdicts)} verdicts, above {MAX_ROLLOUTS_PER_GROUP}"
        )
    group_envelope, group = open_group(forward.group, run_id=run_id, now=now)
    verdicts = []
    for i, sealed in enumerate(forward.verdicts):
        if len(sealed) > MAX_ENVELOPE_BYTES:
            raise InvalidMessage(f"verdict {i} of the forward exceeds {MAX_ENVELOPE_BYTES} bytes")
        try:
            verdicts.append(open_verdict(sealed, run_id=run_id, validator=envelope.signer, now=now)[1])
        except InvalidMessage as exc:
            raise InvalidMessage(f"verdict {i} of the forward: {exc}") from None
    check_verdicts_match(group_envelope.signer, group, verdicts)
    return Forwarded(
        envelope=envelope,
        group_envelope=group_envelope,
        group=group,
        verdict_envelopes=tuple(forward.verdicts),
        verdicts=tuple(verdicts),
        sealed_group=forward.group,
    )
