"""The aggregation rules a run may choose, and the constants every member's arithmetic shares.

`node.collective.aggregate` implements them; this module only names them, so that configs
(`training.trainer.TrainerConfig`, `node.collective.config.AveragingConfig`) can validate a
rule without importing numpy arithmetic.

**CenteredClip** (as in BTARD, Gorbunov et al. 2021):

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

**mean**: the equal-weight mean, kept for comparison.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["AGGREGATION_RULES", "CLIP_MARGIN", "DEFAULT_RULE", "MAX_ITERATIONS", "AggregationRule"]

AggregationRule = Literal["centered_clip", "mean"]
AGGREGATION_RULES: tuple[str, ...] = get_args(AggregationRule)
DEFAULT_RULE: AggregationRule = "centered_clip"

CLIP_MARGIN = 1.5
"""`tau` is this multiple of the median distance to the coordinate-wise median."""

MAX_ITERATIONS = 20
"""CenteredClip stops after this many iterations even if its step is not yet negligible."""
