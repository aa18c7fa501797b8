"""From a parsed wire `Rollout` to the strict `RolloutClaim` the rollout verdict works on, or a rejection.

A rollout group carries each rollout as serialized bytes; they are parsed and hashed by
`protocol.rollout_messages` (`parse_rollout`, `rollout_hash`), the same code the transport
uses, so the validator accepts exactly what the transport accepts. This module adds what only
the validator needs: the sampling parameters must be the run's, and the message becomes a
`RolloutClaim`. Every failure is a `WireRejection` carrying a stable reason code, never an
exception escaping to the caller.
"""

from __future__ import annotations

import struct

from pydantic import ValidationError

from protocol import rollouts_pb2
from training.sampling import SamplingParams
from verification.rollout import MAX_ROLLOUT_TOKENS, RolloutClaim
from verification.verdict import RejectReason

__all__ = ["SAMPLING_PARAMS", "WireRejection", "claim_from_rollout"]

SAMPLING_PARAMS = "sampling_params"
"""Reason code: the rollout's temperature or top-p is not the run's."""


class WireRejection(Exception):
    """The rollout cannot become a claim: `reason` is a stable code, `detail` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
            device=rollout.device,  # type: ignore[arg-type]  # likewise
            proofs=list(rollout.proofs),
        )
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
        )
        raise WireRejection(RejectReason.MALFORMED_CLAIM.value, errors) from None
