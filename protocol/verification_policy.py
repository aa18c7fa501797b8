"""Acceptance limits for rollouts: per (precision, device class), calibrated per model, hashed into the run.

A `VerificationPolicy` holds every limit a verdict applies to one rollout: the TOPLOC figures of
each 32-token chunk, and the sampling check's near-tie tolerance and how many near-tie deviations
a rollout may have. A `RunVerification` is what a run's config carries: one policy per
`"<dtype>/<device class>"` the run allows, the model it was calibrated on, and its SHA-256, which
every node prints and can pin. `hivenet calibrate` (`verification.calibration`) writes one from
measured honest noise and measured cheats (`verification.policy_file` reads and writes the file);
`docs/verification.md` explains how the limits are chosen. The policy is pure data, here beside
the other formats every role shares.

Built-in policies, for runs that name none:

* `EXACT_POLICY` for the `tiny` backend, whose kernels accumulate in float64 and round once, so
  that a KV-cache decode reproduces a prefill bit for bit on any hardware: a few rounding-boundary
  flips per chunk, no sampling tolerance and no near-tie deviation at all.
* `PAPER_POLICY` for an uncalibrated `hf` model: the TOPLOC paper's bf16 limits (at most 38 of 128
  exponent mismatches, mantissa error mean 10, median 8) and a sampling tolerance of two bf16 ulps
  of the row's largest logit. They admit honest native kernels anywhere, and are far looser than a
  calibration: nodes warn that the run should be calibrated.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DEVICE_CLASSES",
    "EXACT_POLICY",
    "PAPER_POLICY",
    "POLICY_DTYPES",
    "DeviceClass",
    "RunVerification",
    "VerificationPolicy",
    "default_run_verification",
    "policy_key",
]

DeviceClass = Literal["cpu", "cuda", "mps"]
DEVICE_CLASSES: tuple[str, ...] = ("cpu", "cuda", "mps")
"""Device classes a worker may claim: where its kernels ran, which decides their rounding."""

POLICY_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Precisions a policy may allow (those a rollout may claim)."""

POLICY_FORMAT: Literal["hivenet-verification-policy-v1"] = "hivenet-verification-policy-v1"


class VerificationPolicy(BaseModel):
    """Limits for the rollouts of one (precision, device class): per 32-token chunk (TOPLOC) and per rollout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_exp_mismatches: int = Field(ge=0, le=128)
    """Most top-k positions per chunk whose exponent may differ."""

    max_sign_mismatches: int = Field(ge=0, le=128)
    """Most top-k positions per chunk whose sign may differ."""

    max_mant_err_mean: float = Field(ge=0.0)
    """Largest mean mantissa error per chunk, in mantissa ulps."""

    max_mant_err_median: float = Field(ge=0.0)
    """Largest upper-median mantissa error per chunk, in mantissa ulps."""

    max_value_mismatches: int = Field(ge=0, le=128)
    """Most top-k values per chunk whose 16 bits may differ at all."""

    sampling_abs_tol: float = Field(ge=0.0)
    """Absolute part of the near-tie tolerance, in logits."""

    sampling_rel_tol: float = Field(ge=0.0)
    """Relative part of the near-tie tolerance, as a fraction of the row's largest |logit|: a token that
    is not the seeded sampler's choice is accepted only if its score is within `abs + rel * max|logit|`
    logits of the choice's (a near tie the honest logit noise can flip)."""

    max_near_tie_deviations: int = Field(ge=0)
    """Most tokens per `near_tie_tokens` completion tokens that may differ from the seeded choice at a
    near tie; a longer rollout is allowed proportionally more (rounded up), a shorter one as many."""

    near_tie_tokens: int = Field(default=128, ge=1)
    """Completion length the near-tie allowance is stated for."""

    def near_tie_allowance(self, tokens: int) -> int:
        """Deviations a rollout of `tokens` completion tokens may have."""
        return math.ceil(
            self.max_near_tie_deviations * max(tokens, self.near_tie_tokens) / self.near_tie_tokens
        )


EXACT_POLICY = VerificationPolicy(
    max_exp_mismatches=2,
    max_sign_mismatches=2,
    max_mant_err_mean=0.05,
    max_mant_err_median=0.0,
    max_value_mismatches=3,
    sampling_abs_tol=0.0,
    sampling_rel_tol=0.0,
    max_near_tie_deviations=0,
)
"""Limits for a backend that reproduces a prefill bit for bit (`tiny`): a rare rounding-boundary flip
moves one committed value by one ulp, or swaps one top-k index (one exponent and maybe one sign
mismatch); three such per chunk are allowed. The nearest tampering (`fp16_as_fp32`) has >= 11
differing values and a mean mantissa error >= 0.079 (`python bench/verification.py` prints the
figures). Sampling: exact, so no tolerance and no deviation."""

PAPER_POLICY = VerificationPolicy(
    max_exp_mismatches=38,
    max_sign_mismatches=38,
    max_mant_err_mean=10.0,
    max_mant_err_median=8.0,
    max_value_mismatches=128,
    sampling_abs_tol=1e-3,
    sampling_rel_tol=2.0**-6,
    max_near_tie_deviations=4,
)
"""The TOPLOC paper's bf16 limits, the fallback for a model no one calibrated (see the module docstring)."""


def policy_key(dtype: str, device: str) -> str:
    """The key of a (precision, device class) in `RunVerification.limits`: `"bfloat16/cpu"`."""
    return f"{dtype}/{device}"


class RunVerification(BaseModel):
    """The verification part of a run's config: limits per allowed (precision, device class)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["hivenet-verification-policy-v1"] = POLICY_FORMAT
    model: str = Field(min_length=1, max_length=80)
    """What the limits were calibrated on: `"tiny"`, the SHA-256 of an `hf` model's weights, or
    `"uncalibrated"` for the paper's fallback."""

    limits: dict[str, VerificationPolicy] = Field(min_length=1)
    """Limits by `policy_key(dtype, device)`; a claim of any other pair is rejected."""

    margins: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Per key, per figure: how far the limit sits below the nearest cheat, as a fraction of that
    cheat's figure (written by `hivenet calibrate`; informational)."""

    @field_validator("limits")
    @classmethod
    def _keys(cls, limits: dict[str, VerificationPolicy]) -> dict[str, VerificationPolicy]:
        for key in limits:
            dtype, _, device = key.partition("/")
            if dtype not in POLICY_DTYPES or device not in DEVICE_CLASSES:
                raise ValueError(
                    f"limit key {key!r} is not '<dtype>/<device>' with dtype in {', '.join(POLICY_DTYPES)} "
                    f"and device in {', '.join(DEVICE_CLASSES)}"
                )
        return limits

    @property
    def sha256(self) -> str:
        """Hash of the limits and the model they are for (what nodes of one run must agree on)."""
        canonical = json.dumps(
            {
                "format": self.format,
                "model": self.model,
                "limits": {k: v.model_dump() for k, v in self.limits.items()},
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def for_claim(self, dtype: str, device: str) -> VerificationPolicy | None:
        """The limits for a rollout claiming `dtype` on `device`, or None if the run does not allow it."""
        return self.limits.get(policy_key(dtype, device))

    def allows_dtype(self, dtype: str) -> bool:
        """Whether some device class may claim `dtype`."""
        return any(key.partition("/")[0] == dtype for key in self.limits)

    def allowed(self) -> str:
        """The allowed pairs, for error messages: `"bfloat16/cpu, float32/cpu"`."""
        return ", ".join(sorted(self.limits))


def _everywhere(policy: VerificationPolicy) -> dict[str, VerificationPolicy]:
    return {policy_key(dtype, device): policy for dtype in POLICY_DTYPES for device in DEVICE_CLASSES}


def default_run_verification(backend: Literal["tiny", "hf"]) -> RunVerification:
    """The policy of a run that names none: exact for `tiny`, the paper's fallback for an `hf` model."""
    if backend == "tiny":
        return RunVerification(model="tiny", limits=_everywhere(EXACT_POLICY))
    return RunVerification(model="uncalibrated", limits=_everywhere(PAPER_POLICY))
