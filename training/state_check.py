"""What a trainer checks itself before it takes an outer state from peers: its held-out loss.

Sources that agree on a state may all be one attacker's identities, so agreement alone proves
nothing in an open run. A trainer can still measure what a candidate state does on its own
held-out batches: one far worse than the state it holds (a poisoned state: huge or non-finite
weights, another model's, a state trained on garbage) is refused. The margin leaves room for
an honest group's state, which may be a little worse than a trainer's own on a few batches.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from node.collective.outer_state import OuterState
from training.causal_lm import CausalLM

__all__ = ["STATE_LOSS_MARGIN", "held_out_loss", "plausible_state"]

logger = logging.getLogger(__name__)

STATE_LOSS_MARGIN = 0.25
"""A candidate state is refused when its held-out loss exceeds ours by more than this fraction."""


@torch.no_grad()
def held_out_loss(model: CausalLM, params: Sequence[torch.Tensor], batches: Sequence[torch.Tensor]) -> float:
    """Mean loss of `params` on `batches`, computed in `model`, whose own parameters are restored."""
    was_training = model.training
    model.eval()
    saved = [p.detach().clone() for p in model.parameters()]
    try:
        for p, value in zip(model.parameters(), params, strict=True):
            p.copy_(value)
        device = model.device
        losses = [float(model.loss(b[:, :-1].to(device), b[:, 1:].to(device))) for b in batches]
    finally:
        for p, s in zip(model.parameters(), saved, strict=True):
            p.copy_(s)
        model.train(was_training)
    return sum(losses) / len(losses)


def plausible_state(
    model: CausalLM,
    own: OuterState,
    candidate: OuterState,
    batches: Sequence[torch.Tensor],
    *,
    name: str = "trainer",
) -> bool:
    """Whether `candidate`'s held-out loss on `batches` is finite and within `STATE_LOSS_MARGIN` of
    `own`'s (True without batches: nothing to check with)."""
    if not batches:
        return True
    ours = held_out_loss(model, own.params, batches)
    theirs = held_out_loss(model, candidate.params, batches)
    if math.isfinite(theirs) and theirs <= ours * (1 + STATE_LOSS_MARGIN):
        return True
    logger.warning(
        "%s: refusing the downloaded state of outer step %d: its held-out loss is %.3f, ours %.3f",
        name, candidate.step, theirs, ours,
    )  # fmt: skip
    return False
