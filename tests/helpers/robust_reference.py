"""A plain torch reference of the aggregation rules (`node.collective.rules`), written for clarity.

Tests hold `node.collective.aggregate`'s deterministic numpy arithmetic to it, and the
robustness benchmark's bounds are stated with it.
"""

from __future__ import annotations

import torch

from node.collective.rules import CLIP_MARGIN, MAX_ITERATIONS

__all__ = ["centered_clip", "clip_radius", "coordinate_median"]

_RELATIVE_STEP_TOLERANCE = 1e-9


def coordinate_median(inputs: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median of `inputs` (shape `(n, d)`), the mean of the two middle values for even n."""
    ordered = inputs.sort(dim=0).values
    n = inputs.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def clip_radius(inputs: torch.Tensor, center: torch.Tensor, margin: float = CLIP_MARGIN) -> float:
    """`margin` times the median distance of the rows of `inputs` (shape `(n, d)`) to `center`."""
    distances = (inputs - center).norm(dim=1)
    return margin * float(coordinate_median(distances[:, None]))


def centered_clip(inputs: torch.Tensor, *, margin: float = CLIP_MARGIN) -> torch.Tensor:
    """CenteredClip of the `n` inputs stacked along dim 0; same dtype and shape as one input."""
    n = inputs.shape[0]
    rows = inputs.reshape(n, -1).to(torch.float64)
    center = coordinate_median(rows)
    tau = clip_radius(rows, center, margin)
    for _ in range(MAX_ITERATIONS):
        offsets = rows - center
        distances = offsets.norm(dim=1)
        scale = torch.where(distances > tau, tau / distances.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
        step = (offsets * scale[:, None]).mean(dim=0)
        center = center + step
        if float(step.norm()) <= _RELATIVE_STEP_TOLERANCE * max(float(center.norm()), 1e-30):
            break
    return center.reshape(inputs.shape[1:]).to(inputs.dtype)
