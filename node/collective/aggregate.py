"""Aggregation of a round's contributions that every member computes to the same bits.

Each member of a round aggregates the same set of decoded contributions itself (there is no
reducer to trust), so the arithmetic must give bit-identical results on every machine, whatever
its thread count. It runs in numpy float64, whose element-wise operations are exactly rounded
and whose reductions (pairwise summation along a contiguous axis, single-threaded) follow a
fixed order; torch's multi-threaded reductions do not. Inputs are taken in a fixed order
(ascending PeerID bytes, chosen by the caller).

Rules, as `node.collective.rules` names them (and documents their bounds): "centered_clip" (start at
the coordinate-wise median, clip radius `CLIP_MARGIN` times the median distance, iterate the
clipped mean) and "mean". Before either, a contribution whose norm exceeds `max_norm_ratio`
times the median norm is refused (with three or more inputs, the median is an honest norm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from node.collective.rules import CLIP_MARGIN, MAX_ITERATIONS, AggregationRule

__all__ = ["Aggregate", "aggregate_contributions", "flatten", "unflatten"]

_RELATIVE_STEP_TOLERANCE = 1e-9


@dataclass
class Aggregate:
    tensors: list[torch.Tensor]
    """The aggregate, float32, in the shapes of the inputs."""
    refused: list[int]
    """Indices of the inputs refused by the norm cap."""


def flatten(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """The tensors' values, concatenated, as one float64 numpy vector."""
    return np.concatenate([t.detach().reshape(-1).to(torch.float64).numpy() for t in tensors])


def unflatten(vector: np.ndarray, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape)) if len(shape) else 1
        out.append(torch.from_numpy(vector[offset : offset + n].astype(np.float32)).reshape(shape))
        offset += n
    return out


def _norms(rows: np.ndarray) -> np.ndarray:
    return np.sqrt(np.add.reduce(np.square(rows), axis=1))


def _median(values: np.ndarray) -> np.ndarray:
    ordered = np.sort(values, axis=0)
    n = values.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def _centered_clip(rows: np.ndarray, margin: float) -> np.ndarray:
    center = _median(rows)
    tau = margin * float(_median(_norms(rows - center)))
    n = rows.shape[0]
    for _ in range(MAX_ITERATIONS):
        offsets = rows - center
        distances = _norms(offsets)
        with np.errstate(over="ignore"):  # rows at the centre overflow here, and take the 1.0 branch
            scale = np.where(distances > tau, tau / np.maximum(distances, np.finfo(np.float64).tiny), 1.0)
        step = np.add.reduce(offsets * scale[:, None], axis=0) / n
        center = center + step
        if float(np.sqrt(np.add.reduce(np.square(step)))) <= _RELATIVE_STEP_TOLERANCE * max(
            float(np.sqrt(np.add.reduce(np.square(center)))), 1e-30
        ):
            break
    return center


def aggregate_contributions(
    contributions: Sequence[Sequence[torch.Tensor]],
    *,
    rule: AggregationRule,
    max_norm_ratio: float | None = None,
    min_norm: float = 0.0,
    margin: float = CLIP_MARGIN,
) -> Aggregate:
    """Aggregate the contributions (each a list of float32 tensors of the same shapes) with `rule`.

    The norm cap is `max_norm_ratio` times the larger of the median norm and `min_norm`: where
    most members barely moved (an RL trainer whose groups all had equal rewards sends zeros), the
    median alone would refuse every ordinary contribution.
    """
    if not contributions:
        raise ValueError("aggregate_contributions needs at least one contribution")
    shapes = [t.shape for t in contributions[0]]
    rows = np.stack([flatten(c) for c in contributions])
    refused: list[int] = []
    if max_norm_ratio is not None and rows.shape[0] >= 3:
        norms = _norms(rows)
        limit = max_norm_ratio * max(float(_median(norms)), min_norm)
        refused = [i for i, norm in enumerate(norms) if norm > limit]
        if refused:
            rows = np.delete(rows, refused, axis=0)
    if rule == "centered_clip":
        result = _centered_clip(rows, margin)
    elif rule == "mean":
        result = np.add.reduce(rows, axis=0) / rows.shape[0]
    else:
        raise ValueError(f"unknown aggregation rule {rule!r}")
    return Aggregate(unflatten(result, shapes), refused)
