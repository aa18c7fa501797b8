"""From a submitted `Rollout` (untrusted protobuf bytes) to a strict `RolloutClaim`, or a rejection.

A rollout group carries each rollout as serialized bytes (its hash is the sha256 of those
bytes). This module parses them strictly, checks the sampling parameters against the run's
and converts the message into the `RolloutClaim` the rollout verdict works on. Every failure
is a `WireRejection` carrying a stable reason code, never an exception escaping to the caller.

The parse is local until `protocol.rollout_messages` (with `parse_rollout` and
`rollout_hash`) lands; then `parse_rollout_bytes` and `rollout_hash` here should defer to it.
"""

from __future__ import annotations

import hashlib
import struct

from pydantic import ValidationError

from protocol import rollouts_pb2
from protocol.errors import InvalidMessage
from protocol.untrusted import capped_bytes, parse_untrusted
from training.sampling import SamplingParams
from verification.rollout import MAX_PROOF_BYTES, MAX_ROLLOUT_TOKENS, RolloutClaim
from verification.verdict import RejectReason

__all__ = [
    "MAX_ROLLOUT_BYTES",
    "SAMPLING_PARAMS",
    "WireRejection",
    "claim_from_rollout",
    "parse_rollout_bytes",
    "rollout_hash",
]

_MAX_TOKEN_VARINT_BYTES = 5
MAX_ROLLOUT_BYTES = (
    2 * MAX_ROLLOUT_TOKENS * _MAX_TOKEN_VARINT_BYTES
    + (MAX_ROLLOUT_TOKENS // 32 + 1) * (MAX_PROOF_BYTES + 4)
    + 1024
)
"""Largest serialized rollout worth parsing: the largest claim `RolloutClaim` admits, plus framing."""

SAMPLING_PARAMS = "sampling_params"
"""Reason code: the rollout's temperature or top-p is not the run's."""


class WireRejection(Exception):
    """The rollout cannot become a claim: `reason` is a stable code, `detail` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def rollout_hash(rollout_bytes: bytes) -> bytes:
    """The rollout's identity: sha256 of its serialized bytes, as receipts name it."""
    return hashlib.sha256(rollout_bytes).digest()


def parse_rollout_bytes(data: object) -> rollouts_pb2.Rollout:
    """Size-capped strict parse of one serialized `Rollout`; `WireRejection(malformed_claim)` if bad."""
    try:
        raw = capped_bytes(data, MAX_ROLLOUT_BYTES, "rollout")
        return parse_untrusted(rollouts_pb2.Rollout, raw, "rollout")
    except InvalidMessage as exc:
        raise WireRejection(RejectReason.MALFORMED_CLAIM.value, str(exc)) from None


def _as_float32(x: float) -> float:
    """`x` rounded as the `float` fields of the wire format store it."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def claim_from_rollout(
    rollout: rollouts_pb2.Rollout, *, policy_version: int, sampling: SamplingParams
) -> RolloutClaim:
    """The strict claim for a parsed rollout generated at `policy_version` with the run's `sampling`.

    The wire stores temperature and top-p as float32; they must equal the run's values rounded
    the same way, and the claim then carries the run's exact values (the ones an honest worker
    sampled with), so that an honest rollout re-verifies bit for bit.
    """
    if rollout.temperature != _as_float32(sampling.temperature) or rollout.top_p != _as_float32(
        sampling.top_p
    ):
        raise WireRejection(
            SAMPLING_PARAMS,
            f"sampled at temperature {rollout.temperature!r}, top_p {rollout.top_p!r}; the run samples at "
            f"temperature {sampling.temperature!r}, top_p {sampling.top_p!r}",
        )
    if len(rollout.prompt_ids) > MAX_ROLLOUT_TOKENS or len(rollout.completion_ids) > MAX_ROLLOUT_TOKENS:
        raise WireRejection(RejectReason.MALFORMED_CLAIM.value, "more tokens than a rollout may hold")
    try:
        return RolloutClaim(
            prompt_ids=list(rollout.prompt_ids),
            completion_ids=list(rollout.completion_ids),
            policy_version=policy_version,
            sampling=sampling,
            seed=int(rollout.seed),
            dtype=rollout.dtype,  # type: ignore[arg-type]  # a Literal, checked by pydantic
            proofs=list(rollout.proofs),
        )
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
        )
        raise WireRejection(RejectReason.MALFORMED_CLAIM.value, errors) from None
