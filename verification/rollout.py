"""`RolloutClaim`: what an inference worker says it generated, as a strict typed message.

A claim carries everything a trainer needs to re-derive the rollout: the prompt and
completion token ids, the policy version, the sampling parameters and seed, the precision
and device class the worker claims to have run at, and one TOPLOC proof per 32 completion tokens. The network
layer wraps it in a signed envelope; this module only defines and bounds its shape.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from protocol.verification_policy import DeviceClass
from training.sampling import SamplingParams

__all__ = ["CLAIM_DTYPES", "MAX_PROOF_BYTES", "MAX_ROLLOUT_TOKENS", "RolloutClaim", "torch_dtype"]

MAX_ROLLOUT_TOKENS = 65536
"""Cap on prompt and on completion length, so a hostile claim cannot ask for unbounded work."""

MAX_PROOF_BYTES = 4096
"""Cap on one proof's size (k = 128 gives 258 bytes; this leaves room for k up to 2047)."""

TokenId = Annotated[int, Field(ge=0, lt=2**31)]
ProofBytes = Annotated[bytes, Field(max_length=MAX_PROOF_BYTES)]

ClaimDtype = Literal["float32", "bfloat16", "float16"]

CLAIM_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""Precisions a worker may claim, by name, and the torch dtype the verifier recomputes in."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a claimed precision name (`"bfloat16"` -> `torch.bfloat16`)."""
    return CLAIM_DTYPES[name]


class RolloutClaim(BaseModel):
    """One rollout as submitted by an inference worker (untrusted until verified)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prompt_ids: list[TokenId] = Field(min_length=1, max_length=MAX_ROLLOUT_TOKENS)
    """The prompt's token ids, as assigned to the worker."""

    completion_ids: list[TokenId] = Field(min_length=1, max_length=MAX_ROLLOUT_TOKENS)
    """The generated token ids."""

    policy_version: int = Field(ge=0)
    """Version of the policy weights the worker says it generated with."""

    sampling: SamplingParams
    """Temperature and top-p used by the seeded sampler."""

    seed: int = Field(ge=0, lt=2**64)
    """Sampling seed: token i's noise is a function of (seed, i) only. It must be assigned to the
    worker with the prompt (a worker free to pick seeds could search for favourable ones)."""

    dtype: ClaimDtype
    """Precision the worker ran the model at; the verifier recomputes in the same one."""

    device: DeviceClass
    """Where the worker's kernels ran (`"cpu"`, `"cuda"`, `"mps"`): with the precision, it picks the
    run's limits for the rollout (a pair the run does not allow is rejected)."""

    proofs: list[ProofBytes] = Field(max_length=MAX_ROLLOUT_TOKENS)
    """TOPLOC proofs over the bf16 final hidden states, one per 32 completion tokens."""
