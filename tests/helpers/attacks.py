"""Byzantine pseudo-gradients, for the robust-aggregation tests and `bench/robustness.py`.

`attack_inputs(kind, honest, own)` gives the `f` attackers' vectors (rows of `own`: each
attacker's own honest pseudo-gradient) given the honest senders' vectors `honest` (rows).
The attackers are omniscient (they know the honest vectors) and stay inside the round's norm
cap (`AveragingConfig.max_norm_ratio`: 10x the round's median norm) at `NORM_FACTOR` times their own:

* "sign_flip": minus `NORM_FACTOR` times their own pseudo-gradient;
* "scaled": `NORM_FACTOR` times their own (an outer step far too long);
* "noise": a random direction, `NORM_FACTOR` times their own norm;
* "alie": "a little is enough" (Baruch et al. 2019): the honest mean minus `z` honest
  standard deviations per coordinate, `z` the largest that still hides among the honest.
"""

from __future__ import annotations

import math
import statistics

import torch

__all__ = ["ATTACKS", "NORM_FACTOR", "alie_z", "attack_inputs", "honest_spread"]

ATTACKS = ("sign_flip", "scaled", "noise", "alie")
NORM_FACTOR = 9.0


def alie_z(n: int, f: int) -> float:
    """The ALIE paper's z for `f` attackers among `n`: enough to shift, few enough to pass as honest."""
    supporters = n // 2 + 1 - f
    return statistics.NormalDist().inv_cdf((n - supporters) / n)


def attack_inputs(
    kind: str, honest: torch.Tensor, own: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The attackers' rows for attack `kind` (one per row of `own`)."""
    if kind == "sign_flip":
        return -NORM_FACTOR * own
    if kind == "scaled":
        return NORM_FACTOR * own
    if kind == "noise":
        direction = torch.randn(own.shape, generator=generator, dtype=own.dtype)
        norms = own.norm(dim=1, keepdim=True) / direction.norm(dim=1, keepdim=True)
        return NORM_FACTOR * direction * norms
    if kind == "alie":
        n = honest.shape[0] + own.shape[0]
        z = alie_z(n, own.shape[0])
        target = honest.mean(dim=0) - z * honest.std(dim=0)
        return target.expand(own.shape[0], -1).clone()
    raise ValueError(f"unknown attack {kind!r}; expected one of {ATTACKS}")


def honest_spread(honest: torch.Tensor) -> float:
    """The largest distance of an honest row to the honest mean."""
    return float((honest - honest.mean(dim=0)).norm(dim=1).max()) if honest.numel() else math.nan
