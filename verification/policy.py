"""Acceptance thresholds for rollouts: every limit the verdict applies, in one place.

How they were chosen (measured with `python bench/toploc.py --calibrate`, which prints the
per-kind ranges below; TinyGPT default config, 96-token completions, 16 cases per kind):

* Honest rollouts (generated and re-verified in float32, bfloat16 or float16): **every figure
  is exactly 0** (exponent, sign and value mismatches, mantissa mean and median, sampling
  gap). That is by design: with autograd off, `TinyGPT` accumulates every operation in
  float64 and rounds once to the model dtype, so incremental decoding reproduces a prefill
  bit for bit (the float64 noise, ~1e-16, is far below any storage ulp).
  Why not float32 accumulation (twice as fast a prefill): measured the same way, honest bf16
  rollouts then reach 36 differing values and a mean mantissa error of 0.96 in a chunk (row
  sums differ between one-token decoding and a prefill, and a flipped rounding spreads), which
  overlaps every precision swap (fp32_as_bf16 from 0.49), and honest fp16 overlaps fp16_as_fp32.
* Honest noise that can still occur: a rare rounding-boundary flip (float64 noise landing
  on a storage-dtype rounding boundary, or an elementwise libm differing by one ulp between
  CPUs). Each flips one committed value by one mantissa ulp, or, at the top-k boundary,
  swaps one index (then that position reads as an unrelated value: one exponent mismatch,
  maybe one sign mismatch). The limits below allow a few such events per 32-token chunk.
* Nearest tampering, worst chunk of each rollout (min over rollouts of the max over chunks):
  `fp16_as_fp32` has >= 11 differing values and mean mantissa error >= 0.079; every other
  precision swap (fp32/bf16/fp16 claiming bf16/fp32) has >= 57 differing values and mean >=
  0.46; weights x (1 + 1% noise) >= 104 values, mean >= 1.7, >= 3 exponent mismatches; a
  prompt with one token changed >= 98 values; other weights or reordered proofs >= 118
  exponent mismatches.
* Sampling: honest gap 0.0 exactly; a greedy worker has a max gap >= 7.4 logits and a single
  swapped token >= 2.6 logits (temperature 1).

So the limits sit just above the honest-noise allowance and far below every tampering.

Scope: these limits assume the worker runs `TinyGPT`'s own inference path (float64
accumulation, one rounding per operation), on any hardware. A worker using native
half-precision kernels (float32 or half accumulation, e.g. a GPU matmul) would differ from
the verifier by ~1 ulp on many values, exactly like a precision swap, and be rejected;
supporting such workers needs a per-backend calibration, not looser defaults.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_POLICY", "VerificationPolicy"]

# A boundary flip at the k-th magnitude makes one position an unrelated value (one exponent
# mismatch); allow two such per chunk. Nearest tampering by exponents alone: 1 (fp16_as_fp32),
# which the value count and mantissa mean below catch instead; other weights: >= 118.
MAX_EXP_MISMATCHES = 2

# Signs only differ at a swapped top-k index (or for negated activations: k of k). Same allowance.
MAX_SIGN_MISMATCHES = 2

# Three one-ulp flips in a chunk give a mean of 3/126 = 0.024; the nearest tampering
# (fp16_as_fp32) has a worst-chunk mean >= 0.079, the paper's bf16 threshold (10) is far looser.
MAX_MANT_ERR_MEAN = 0.05

# A non-zero median means more than half of the matching values differ: never honest here
# (honest median is 0 even with the allowed flips); every precision swap but one has median 1.
MAX_MANT_ERR_MEDIAN = 0.0

# Values whose 16 bits differ at all: honest 0 (3 flips allowed); fp16_as_fp32 >= 11.
MAX_VALUE_MISMATCHES = 3

# Sampling gap tolerance in logits: abs + rel * max|logit| of the row. rel = 2**-6 is two
# bf16 ulps of the largest logit (one rounding step on each of the two compared logits);
# abs covers logits near zero. Honest gap: 0.0; cheating tokens: >= 2.6 logits.
SAMPLING_ABS_TOL = 1e-3
SAMPLING_REL_TOL = 2.0**-6


class VerificationPolicy(BaseModel):
    """Limits per 32-token chunk (TOPLOC) and per token (sampling); defaults are the constants above."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_exp_mismatches: int = Field(default=MAX_EXP_MISMATCHES, ge=0)
    """Most top-k positions per chunk whose exponent may differ."""

    max_sign_mismatches: int = Field(default=MAX_SIGN_MISMATCHES, ge=0)
    """Most top-k positions per chunk whose sign may differ."""

    max_mant_err_mean: float = Field(default=MAX_MANT_ERR_MEAN, ge=0.0)
    """Largest mean mantissa error per chunk, in mantissa ulps."""

    max_mant_err_median: float = Field(default=MAX_MANT_ERR_MEDIAN, ge=0.0)
    """Largest upper-median mantissa error per chunk, in mantissa ulps."""

    max_value_mismatches: int = Field(default=MAX_VALUE_MISMATCHES, ge=0)
    """Most top-k values per chunk whose 16 bits may differ at all."""

    sampling_abs_tol: float = Field(default=SAMPLING_ABS_TOL, ge=0.0)
    """Absolute part of the per-token sampling tolerance, in logits."""

    sampling_rel_tol: float = Field(default=SAMPLING_REL_TOL, ge=0.0)
    """Relative part of the sampling tolerance, as a fraction of the row's largest |logit|."""


DEFAULT_POLICY = VerificationPolicy()
"""The policy trainers apply unless configured otherwise."""
