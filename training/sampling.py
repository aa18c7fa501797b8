"""Seeded sampling: token choices that a verifier can recompute from (seed, position) alone.

The sampler is Gumbel-max: the token at completion index `i` is

    argmax_j  logits_j / temperature + g(seed, i, j)      over the top-p nucleus,

where `g` is standard Gumbel noise from a counter-based hash (splitmix64) of
`(seed, i, j)`. This is an exact sample from softmax(logits / temperature) restricted to the
nucleus, and it depends on nothing but the logits and `(seed, i)`: no RNG state, no batch,
no thread. A verifier that recomputes the logits (one prefill) can therefore check every
chosen token; see `verification.sampling_check` for the tolerance to numerical noise.

The nucleus is defined without sort-order ambiguity: token j is in it iff the probability
mass of the tokens *strictly* more likely than j is below `top_p` (ties are all in or all
out). `top_p >= 1` keeps every token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SamplingParams",
    "gumbel_noise",
    "mass_before",
    "sample_tokens",
    "seeded_scores",
]

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class SamplingParams(BaseModel):
    """How completion tokens are drawn; carried in every rollout so the verifier can recheck."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    temperature: float = Field(default=1.0, gt=0.0, le=100.0)
    """Logits are divided by this before adding the seeded Gumbel noise (greedy is not offered)."""

    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus mass: only tokens with less than `top_p` mass strictly above them are eligible."""


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def gumbel_noise(
    seed: int | Sequence[int], positions: np.ndarray | Sequence[int], vocab_size: int
) -> np.ndarray:
    """Standard Gumbel noise `[len(positions), vocab_size]` (float64) for `(seed, position, token)`.

    `seed` is any integer in [0, 2**64), or one such seed per position (the rows of several
    completions at once); `positions` are completion indices (0 = first generated token).
    The values are platform-independent.
    """
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not isinstance(seed, int) and len(seeds) != len(positions):
        raise ValueError(
            f"{len(seeds)} seeds for {len(positions)} positions: give one seed, or one per position"
        )
    if seeds and not (min(seeds) >= 0 and max(seeds) < 2**64):
        raise ValueError(f"seeds must be in [0, 2**64), got {min(seeds)}..{max(seeds)}")
    pos = np.asarray(positions, dtype=np.uint64).reshape(-1, 1)
    tok = np.arange(vocab_size, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array(seeds, dtype=np.uint64)).reshape(-1, 1)
        row = _splitmix64(key ^ _splitmix64(pos))
        bits = _splitmix64(row + tok * _GOLDEN)
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return -np.log(-np.log(u))


def seeded_scores(
    logits: torch.Tensor, temperature: float, seed: int, positions: np.ndarray | list[int]
) -> torch.Tensor:
    """Gumbel-max scores `logits / temperature + noise` in float64, `[N, V]` for logits `[N, V]`."""
    noise = torch.from_numpy(gumbel_noise(seed, positions, logits.shape[-1]))
    return logits.detach().to(torch.float64).cpu() / temperature + noise


def mass_before(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """For each token, the probability mass of the tokens strictly more likely than it, `[N, V]`.

    Probabilities are softmax(logits / temperature) in float64.
    """
    probs = torch.softmax(logits.detach().to(torch.float64).cpu() / temperature, dim=-1)
    desc = probs.sort(dim=-1, descending=True).values
    cum = torch.cat([torch.zeros_like(desc[:, :1]), desc.cumsum(dim=-1)], dim=-1)
    # Number of tokens strictly more likely than each token (ascending view for searchsorted).
    n_above = torch.searchsorted(-desc, -probs, right=False)
    return cum.gather(-1, n_above)


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, seed: int, positions: np.ndarray | list[int]
) -> torch.Tensor:
    """Seeded tokens (`LongTensor [N]`) for logits `[N, V]` at completion indices `positions`."""
    scores = seeded_scores(logits, params.temperature, seed, positions)
    if params.top_p < 1.0:
        eligible = mass_before(logits, params.temperature) < params.top_p
        scores = scores.masked_fill(~eligible, float("-inf"))
    return scores.argmax(dim=-1)
