"""How a reducer combines the senders' inputs of one part: CenteredClip (the default) or the plain mean.

Pure tensor functions, used by the all-reduce reducer (`node.averaging.runner`) and by the
robustness benchmark, so that both run the same arithmetic.

**CenteredClip** (as in BTARD, Gorbunov et al. 2021), `centered_clip(inputs)`:

* start at the coordinate-wise median `v0` of the inputs;
* clip radius `tau = CLIP_MARGIN * median_i ||x_i - v0||`, taken from the data: while more
  than half of the inputs are honest, the median distance is an honest one, so `tau` is at
  most `CLIP_MARGIN` times the largest honest distance to `v0`;
* iterate `v <- v + mean_i (x_i - v) * min(1, tau / ||x_i - v||)` until the step is
  negligible (at most `MAX_ITERATIONS`), in float64.

Each input pulls the centre by at most `tau / n` per iteration, whatever its norm or
direction. At the fixed point with the honest inputs unclipped, `f` attackers among `n`
inputs move the result at most `f * tau / (n - f)` from the honest mean. With honest inputs
only, their distances to the centre are alike (pseudo-gradients of many values concentrate),
`CLIP_MARGIN` leaves them unclipped, and the first step lands on the mean exactly: the
result is the mean up to float64 rounding.

What it does not stop: inputs that stay within about `tau` of the honest ones (e.g. "a little
is enough", shifted by a fraction of the honest spread per coordinate) still move the result
by up to `f * tau / (n - f)`; and with `f >= n / 2` attackers the radius itself is theirs.

`aggregate(rule, inputs)` picks the rule by name: "centered_clip" or "mean" (the
equal-weight mean, the behaviour before robust aggregation, kept for comparison).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = [
    "AGGREGATION_RULES",
    "CLIP_MARGIN",
    "DEFAULT_RULE",
    "AggregationRule",
    "aggregate",
    "centered_clip",
    "clip_radius",
    "coordinate_median",
]

AggregationRule = Literal["centered_clip", "mean"]
AGGREGATION_RULES: tuple[str, ...] = get_args(AggregationRule)
DEFAULT_RULE: AggregationRule = "centered_clip"

CLIP_MARGIN = 1.5
"""`tau` is this multiple of the median distance to the coordinate-wise median."""

MAX_ITERATIONS = 20
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
    """CenteredClip of the `n` inputs stacked along dim 0 (see module docstring); same dtype and shape as one input."""
    n = inputs.shape[0]
    if n == 0:
        raise ValueError("centered_clip needs at least one input")
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


def aggregate(rule: AggregationRule, inputs: torch.Tensor) -> torch.Tensor:
    """Combine the inputs stacked along dim 0 with `rule` ("centered_clip" or "mean")."""
    if rule == "centered_clip":
        return centered_clip(inputs)
    if rule == "mean":
        return inputs.mean(dim=0)
    raise ValueError(f"unknown aggregation rule {rule!r}; expected one of {AGGREGATION_RULES}")
