"""How `TinyGPT.forward_shared_prefix` lays out sequences of different lengths for attention.

Every row-wise layer sees only the real rows of the sequences that follow the shared prefix;
attention needs them as right-padded grids `[batch, time]`. One grid padded to the longest
sequence wastes most of its work when lengths differ (a verifier's group of completions: a
few long, most short), and attention dominates a small model's prefill: the scores of every
padded query against every key are computed (in float64) and masked afterwards. So the
sequences are split into buckets of similar length, longest first, each padded only to its own
longest member: `plan` picks the split that minimises the estimated cost (score entries, plus
a fixed cost per bucket for the calls it adds).

How the rows are split changes no real row's result: a query sees only the prefix and the
keys before it in its own sequence, whichever grid it sits in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["Bucket", "Ragged", "plan"]

BUCKET_OVERHEAD_SCORES = 4096
"""The fixed cost of one more bucket (its copies and attention call), in score entries."""


class Bucket(NamedTuple):
    """Some of the sequences, padded into one grid `[batch, time]`."""

    flat: torch.Tensor
    """Their real rows' indices among the `N` continuation rows (sequence 0's rows first)."""
    grid: torch.Tensor
    """The same rows' indices in this bucket's flattened grid `[batch * time]`."""
    batch: int
    time: int


class Ragged(NamedTuple):
    """Rows `[prefix + N, d]`: a shared prefix of `prefix` positions, then the `N` real rows of the
    sequences that follow it, laid out for attention as `buckets`."""

    prefix: int
    buckets: tuple[Bucket, ...]

    @property
    def rows(self) -> int:
        """`prefix + N`."""
        return self.prefix + sum(int(bucket.flat.numel()) for bucket in self.buckets)


def plan(prefix: int, lengths: Sequence[int]) -> Ragged:
    """The buckets for sequences of `lengths` real rows after a shared prefix of `prefix` rows."""
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    buckets = []
    for members in _split(prefix, [lengths[i] for i in order]):
        chosen = [order[j] for j in members]
        time = lengths[chosen[0]]
        flat = [r for i in chosen for r in range(starts[i], starts[i] + lengths[i])]
        grid = [row * time + c for row, i in enumerate(chosen) for c in range(lengths[i])]
        buckets.append(Bucket(torch.tensor(flat), torch.tensor(grid), len(chosen), time))
    return Ragged(prefix, tuple(buckets))


def _split(prefix: int, descending: Sequence[int]) -> list[range]:
    """The cheapest split of lengths sorted longest first into runs (dynamic programming)."""
    n = len(descending)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sequences
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):
            width = descending[start]
            cost = best[start] + BUCKET_OVERHEAD_SCORES + (end - start) * width * (prefix + width)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs = []
    end = n
    while end > 0:
        runs.append(range(cut[end], end))
        end = cut[end]
    return runs[::-1]
