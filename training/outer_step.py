"""DiLoCo's arithmetic: its configuration, the pseudo-gradient and the outer Nesterov step.

Per outer step `t`: `delta = theta_t - theta_local` (the pseudo-gradient: positive where
the inner steps decreased a weight), `d = mean over peers of delta`,
`m = momentum * m + d`, `theta_{t+1} = theta_t - lr * (d + momentum * m)` (Nesterov, as
`torch.optim.SGD(nesterov=True)`). With `lr=1, momentum=0` this is plain parameter
averaging. Since every group member applies the same update to the same inputs, all peers
hold bit-identical parameters afterwards; `state_hash` checks that.

The inner learning rate follows `DiLoCoConfig.inner_lr_at(global inner step)`: linear warmup,
then (by default) a cosine decay over the whole run, as in the DiLoCo and OpenDiLoCo papers.
The global inner step is `outer step * inner_steps + h`, so every peer, a late joiner
included, uses the same learning rate for the same round. (The AdamW moments stay local to
each peer, as in DiLoCo; a peer that adopts a downloaded state restarts them.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from node.collective.outer_state import OuterState

__all__ = ["DiLoCoConfig", "outer_update", "pseudo_gradient"]


class DiLoCoConfig(BaseModel):
    """Hyperparameters of DiLoCo (inner AdamW, outer Nesterov SGD)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inner_steps: int = Field(default=100, ge=1)
    """H: inner AdamW steps between two outer steps."""

    inner_lr: float = Field(default=3e-3, gt=0.0)
    """Learning rate of the inner AdamW."""

    inner_weight_decay: float = Field(default=0.1, ge=0.0)
    """Decoupled weight decay of the inner AdamW."""

    inner_betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas of the inner optimizer."""

    inner_warmup_steps: int = Field(default=50, ge=0)
    """Inner steps (counted over the whole run) of linear learning-rate warmup."""

    inner_lr_schedule: Literal["constant", "cosine"] = "cosine"
    """After warmup: keep `inner_lr` ("constant") or decay it by a half cosine ("cosine") to
    `inner_lr * inner_lr_min_ratio` at the run's last inner step, `max_outer_steps * inner_steps`
    (constant when `max_outer_steps` is None). The step is the run's global inner step
    (`outer step * inner_steps + h`), so every peer, late joiners included, uses the same lr."""

    inner_lr_min_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Final inner learning rate of the cosine schedule, as a fraction of `inner_lr`."""

    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Inner gradients are clipped to this global norm."""

    outer_lr: float = Field(default=0.7, gt=0.0)
    """Learning rate of the outer SGD."""

    outer_momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Momentum of the outer SGD (Nesterov)."""

    nesterov: bool = True
    """Use Nesterov momentum in the outer step (plain heavy-ball momentum if false)."""

    max_outer_steps: int | None = Field(default=None, ge=1)
    """Stop after this outer step number is reached (None: run until stopped)."""

    eval_every_outer_steps: int = Field(default=0, ge=0)
    """Evaluate the held-out loss every this many outer steps (0: never)."""

    overlap_communication: bool = True
    """Run the next round's inner steps while this round's exchange is in flight (one-round overlap)."""

    def total_inner_steps(self) -> int | None:
        """Inner steps of the whole run per trainer (None without `max_outer_steps`)."""
        return None if self.max_outer_steps is None else self.max_outer_steps * self.inner_steps

    def inner_lr_at(self, step: int, total_steps: int | None = None) -> float:
        """The inner learning rate of 0-based global inner step `step`: warmup, then the schedule.

        `total_steps` is the length of the run the schedule spans (default
        `total_inner_steps()`); baselines with another step count pass their own.
        """
        warm = self.inner_warmup_steps
        if warm and step < warm:
            return self.inner_lr * (step + 1) / warm
        total = self.total_inner_steps() if total_steps is None else total_steps
        if self.inner_lr_schedule == "constant" or total is None or total <= warm:
            return self.inner_lr
        progress = min(1.0, (step - warm) / max(1, total - 1 - warm))
        floor = self.inner_lr_min_ratio
        return self.inner_lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def pseudo_gradient(
    outer_params: Sequence[torch.Tensor], params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """`outer - current` per tensor: the direction the inner steps moved, with the sign of a gradient."""
    return [
        o - p.detach().to(device=o.device, dtype=torch.float32)
        for o, p in zip(outer_params, params, strict=True)
    ]


@torch.no_grad()
def outer_update(state: OuterState, averaged: Sequence[torch.Tensor], config: DiLoCoConfig) -> OuterState:
    """Apply one outer SGD step with the averaged pseudo-gradient; returns the new state (step + 1)."""
    lr, mu = config.outer_lr, config.outer_momentum
    params: list[torch.Tensor] = []
    momentum: list[torch.Tensor] = []
    for p, m, d in zip(state.params, state.momentum, averaged, strict=True):
        if mu > 0:
            m_new = m * mu + d
            direction = d + mu * m_new if config.nesterov else m_new
        else:
            m_new, direction = torch.zeros_like(m), d
        params.append(p - lr * direction if lr != 1.0 else p - direction)
        momentum.append(m_new)
    return OuterState(params, momentum, state.step + 1)
