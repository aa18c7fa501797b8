"""How a GRPO trainer's steps become policy versions: the `PolicyUpdates` protocol and its default.

`EveryStepUpdates` (one trainer alone) makes every optimizer step a version; several trainers of a
run use `training.rl_diloco.DiLoCoUpdates`, whose versions are their common outer steps. The
trainer (`training.rl_trainer.RLTrainer`) builds one with an `UpdatesFactory`, publishes each new
version and checkpoints what `saved_state` returns (`training.rl_checkpoint`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from training.causal_lm import CausalLM
from training.checkpoint import CheckpointError
from training.grpo import GRPOConfig, GRPOLearner, GRPOStepReport, ScoredRollout

__all__ = ["EveryStepUpdates", "PolicyUpdates", "UpdatesFactory", "every_step_updates"]


class PolicyUpdates(Protocol):
    """Turns GRPO batches into policy versions (the trainer publishes each new one)."""

    @property
    def learner(self) -> GRPOLearner:
        """Its model holds the newest version's weights whenever `step` returns True."""
        ...

    @property
    def version(self) -> int:
        """The newest policy version: what rollouts, staleness and publishing refer to."""
        ...

    def step(
        self, batch: Sequence[Sequence[ScoredRollout]], *, stop_event: threading.Event | None = None
    ) -> tuple[GRPOStepReport, bool]:
        """One GRPO step on `batch`; True when it made a new policy version. A download of the run's
        state that the step may need gives up once `stop_event` is set."""
        ...

    def saved_state(self) -> dict[str, torch.Tensor]:
        """What a restart needs besides the newest version's weights (saved with them in the checkpoint)."""
        ...

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        """Take back what `saved_state` returned before a restart; CheckpointError if it does not fit."""
        ...

    def close(self) -> None: ...


class EveryStepUpdates:
    """One trainer alone: every GRPO optimizer step is a new policy version."""

    def __init__(self, learner: GRPOLearner) -> None:
        self.learner = learner

    @property
    def version(self) -> int:
        return self.learner.version

    def step(
        self, batch: Sequence[Sequence[ScoredRollout]], *, stop_event: threading.Event | None = None
    ) -> tuple[GRPOStepReport, bool]:
        return self.learner.step(batch), True

    def saved_state(self) -> dict[str, torch.Tensor]:
        return {}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        if saved:
            raise CheckpointError(
                "the checkpoint was written by a trainer with DiLoCo: resume it with the same DiLoCo settings"
            )

    def close(self) -> None:
        pass


UpdatesFactory = Callable[[CausalLM, GRPOConfig, int], PolicyUpdates]
"""Builds a trainer's `PolicyUpdates` from (policy, GRPO config, the version it starts at)."""


def every_step_updates(policy: CausalLM, config: GRPOConfig, version: int) -> PolicyUpdates:
    return EveryStepUpdates(GRPOLearner(policy, config, version=version))
