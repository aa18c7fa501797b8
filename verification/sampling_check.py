"""Checks that every completion token is the one the seeded sampler picks from recomputed logits.

The worker's sampler (`training.sampling`) picks, at completion index i,
`argmax_j logits_j / T + g(seed, i, j)` over the top-p nucleus. The verifier recomputes the
logits by prefill and, for each token, measures its **gap**: how far (in logit units, i.e.
score difference times T) the claimed token's score falls below the best score among the
tokens that are surely in the nucleus. An honest token has gap 0, except at a *near tie*, where
the worker's logit noise flipped the order of two scores closer than twice that noise; a token
picked by the worker (greedy, swapped) has a gap of order one logit. The verdict
(`verification.verdict`) rejects any gap above the tolerance and counts the non-zero ones
(`SamplingCheck.deviations`): honest noise flips few near ties, a worker that takes the other
token at every near tie flips them all.

The nucleus is judged with a slack that matches the logit tolerance: a logit error of at most
`tol` changes every probability by at most a factor `exp(2 tol / T)`, hence the mass above a
token by at most `delta = expm1(2 tol / T)`; the claimed token must lie in the loose nucleus
(`mass_before < top_p + delta`) and is compared against the tight one (`< top_p - delta`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from training.sampling import SamplingParams, gumbel_noise, mass_before, seeded_scores

__all__ = ["SamplingCheck", "check_sampling", "check_sampling_batch"]


@dataclass(frozen=True)
class SamplingCheck:
    """Per-token figures of the seeded-sampling check, plus where the worst token is."""

    gaps: np.ndarray
    """Per-token gap in logit units (>= 0; +inf for a token outside the loose nucleus)."""

    tolerances: np.ndarray
    """Per-token allowed gap in logit units."""

    @property
    def failing(self) -> np.ndarray:
        """Completion indices whose gap exceeds the tolerance."""
        return np.nonzero(self.gaps > self.tolerances)[0]

    @property
    def deviations(self) -> int:
        """Tokens that are not the seeded sampler's choice on the recomputed logits (gap > 0): near ties
        an honest worker's logit noise flipped, or a worker's own choices."""
        return int(np.count_nonzero(self.gaps > 0.0))

    @property
    def max_gap(self) -> float:
        """Largest gap over the completion (0.0 for an honest rollout with exact logits)."""
        return float(self.gaps.max()) if self.gaps.size else 0.0


def check_sampling(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    params: SamplingParams,
    seed: int,
    *,
    abs_tol: float,
    rel_tol: float,
) -> SamplingCheck:
    """Gap of each claimed token against the seeded sampler on recomputed `logits [N, V]`.

    The tolerance for row i is `abs_tol + rel_tol * max_j |logits[i, j]|` logits.
    """
    wide = logits.detach().to(torch.float64).cpu()
    scores = seeded_scores(wide, params.temperature, seed, np.arange(logits.shape[0]))
    return _check_rows(wide, scores, tokens.to(torch.long).cpu(), params, abs_tol, rel_tol)


def check_sampling_batch(
    logits: Sequence[torch.Tensor],
    tokens: Sequence[torch.Tensor],
    params: SamplingParams,
    seeds: Sequence[int],
    *,
    abs_tol: float,
    rel_tol: float,
) -> list[SamplingCheck]:
    """`check_sampling` for several completions sampled with the same `params`, in one pass.

    Every figure is computed row by row, so stacking the completions' rows changes none of
    them: each result is bit for bit what `check_sampling` returns for that completion alone,
    for a fraction of the per-call overhead.
    """
    if not len(logits) == len(tokens) == len(seeds):
        raise ValueError(f"{len(logits)} logits, {len(tokens)} token rows and {len(seeds)} seeds")
    if not logits:
        return []
    wide = torch.cat([row.detach().cpu() for row in logits]).to(torch.float64)
    lengths = [row.shape[0] for row in logits]
    positions = np.concatenate([np.arange(n) for n in lengths])
    row_seeds = [seed for seed, n in zip(seeds, lengths, strict=True) for _ in range(n)]
    noise = gumbel_noise(row_seeds, positions, wide.shape[-1])
    scores = wide / params.temperature + torch.from_numpy(noise)
    all_tokens = torch.cat([row.to(torch.long).cpu() for row in tokens])
    stacked = _check_rows(wide, scores, all_tokens, params, abs_tol, rel_tol)
    bounds = np.cumsum([0, *lengths])
    return [
        SamplingCheck(gaps=stacked.gaps[a:b], tolerances=stacked.tolerances[a:b])
        for a, b in itertools.pairwise(bounds)
    ]


def _check_rows(
    wide: torch.Tensor,
    scores: torch.Tensor,
    tokens: torch.Tensor,
    params: SamplingParams,
    abs_tol: float,
    rel_tol: float,
) -> SamplingCheck:
    """The gaps of `tokens [N]` given float64 `wide [N, V]` logits and their seeded `scores`."""
    n = wide.shape[0]
    tol = abs_tol + rel_tol * wide.abs().amax(dim=-1)
    rows = torch.arange(n)
    if params.top_p < 1.0:
        delta = torch.expm1(2.0 * tol / params.temperature).unsqueeze(-1)
        before = mass_before(wide, params.temperature)
        tight = before < params.top_p - delta
        loose = before < params.top_p + delta
        # The most likely token is always in the nucleus.
        tight[rows, wide.argmax(dim=-1)] = True
        best = scores.masked_fill(~tight, -math.inf).amax(dim=-1)
        in_loose = loose[rows, tokens]
    else:
        best = scores.amax(dim=-1)
        in_loose = torch.ones(n, dtype=torch.bool)
    gaps = ((best - scores[rows, tokens]) * params.temperature).clamp(min=0.0)
    gaps = gaps.masked_fill(~in_loose, math.inf)
    return SamplingCheck(gaps=gaps.numpy(), tolerances=tol.numpy())
