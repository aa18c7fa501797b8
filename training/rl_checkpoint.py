"""An RL trainer's checkpoint: everything a restarted trainer needs to go on as if it never stopped.

One file, `policy.pt` in the trainer's checkpoint directory, holds the newest version's weights,
its number, the number of GRPO steps taken up to it, what the trainer's `PolicyUpdates` needs besides them (`saved_state`, e.g. DiLoCo's
outer momentum) and the learner's optimizer state (AdamW's moments and step counts), so that a
resumed trainer's next update is the one it would have made without the restart. It is written
atomically (temporary file, fsync, rename), as `training.checkpoint` writes DiLoCo's, so a trainer
killed while writing leaves the previous checkpoint whole.

The file is read with `torch.load(weights_only=True)` (tensors and plain containers only) and
every part is checked before it is used: a file that is not a checkpoint of this run's policy is a
`CheckpointError` that says what is wrong and how to start over. A checkpoint written before the
optimizer state was saved still loads: the optimizer starts afresh, with one warning.

The optimizer takes back its moments and step counts only; its learning rate and other settings
are the run's config, so a restart with a new config uses the new settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from training.checkpoint import CheckpointError

if TYPE_CHECKING:
    from training.causal_lm import CausalLM
    from training.grpo import GRPOConfig
    from training.policy_updates import PolicyUpdates, UpdatesFactory

__all__ = [
    "CHECKPOINT_NAME",
    "RLCheckpoint",
    "checkpoint_updates",
    "load_rl_checkpoint",
    "optimizer_state",
    "restore_optimizer",
    "resume_updates",
    "save_rl_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "policy.pt"


@dataclass(frozen=True)
class RLCheckpoint:
    """What an RL trainer's checkpoint holds."""

    state: dict[str, torch.Tensor]
    """The newest version's weights."""
    version: int
    updates: dict[str, torch.Tensor]
    """What the trainer's `PolicyUpdates.saved_state` returned."""
    optimizer: dict[str, Any] | None
    """The learner's optimizer state (`optimizer_state`); None in a checkpoint written before it was saved."""
    steps: int = 0
    """GRPO steps the trainer had taken when it made this version (0 in a checkpoint written before
    they were saved): a resumed trainer numbers its next step so."""


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A copy of `optimizer`'s state on the CPU (a checkpoint loads on any device)."""
    saved = optimizer.state_dict()
    return {
        "state": {
            index: {name: _cpu_copy(value) for name, value in entry.items()}
            for index, entry in saved["state"].items()
        },
        "param_groups": saved["param_groups"],
    }


def _cpu_copy(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def save_rl_checkpoint(directory: Path, checkpoint: RLCheckpoint) -> Path:
    """Write `checkpoint` to `directory/policy.pt` atomically and return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    tmp = directory / (CHECKPOINT_NAME + ".tmp")
    saved: dict[str, Any] = {
        "state": checkpoint.state,
        "version": checkpoint.version,
        "updates": checkpoint.updates,
        "steps": checkpoint.steps,
    }
    if checkpoint.optimizer is not None:
        saved["optimizer"] = checkpoint.optimizer
    torch.save(saved, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def load_rl_checkpoint(directory: Path) -> RLCheckpoint | None:
    """The checkpoint in `directory` (None if it holds none); CheckpointError if it is unreadable or malformed."""
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise _unusable(path, f"cannot read it: {exc!r}") from None
    if not isinstance(saved, dict):
        raise _unusable(path, f"it holds a {type(saved).__name__}, not a checkpoint")
    version = saved.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise _unusable(path, f"its version is {version!r}, not a version number")
    steps = saved.get("steps", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise _unusable(path, f"its step count is {steps!r}, not a number of steps")
    optimizer = saved.get("optimizer")
    if optimizer is not None and not isinstance(optimizer, dict):
        raise _unusable(path, "its optimizer state is not a mapping")
    return RLCheckpoint(
        state=_tensors(path, saved.get("state"), "weights"),
        version=version,
        updates=_tensors(path, saved.get("updates", {}), "updates state"),
        optimizer=optimizer,
        steps=steps,
    )


def _tensors(path: Path, value: object, what: str) -> dict[str, torch.Tensor]:
    """`value` if it maps names to tensors, else CheckpointError."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    ):
        raise _unusable(path, f"its {what} are not a mapping of names to tensors")
    return value


def _unusable(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a usable checkpoint of this run's policy ({why}); move it away to start from version 0"
    )


def restore_optimizer(
    optimizer: torch.optim.Optimizer, saved: Mapping[str, Any] | None, *, source: Path
) -> None:
    """Take back the moments and step counts of `saved` (from `optimizer_state`) into `optimizer`.

    None (a checkpoint from before optimizer state was saved) leaves it fresh, with a warning;
    state that does not fit the optimizer's parameters is a CheckpointError.
    """
    if saved is None:
        logger.warning(
            "%s holds no optimizer state (written by an older version): the optimizer starts afresh", source
        )
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = saved.get("state")
    if not isinstance(state, dict):
        raise _unfit(source, "it has no per-parameter state")
    for index, entry in state.items():
        _check_entry(source, index, entry, params)
    current = optimizer.state_dict()["param_groups"]  # the run's settings, not the checkpoint's
    try:
        optimizer.load_state_dict({"state": state, "param_groups": current})
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _unfit(source, repr(exc)) from None


def _check_entry(source: Path, index: object, entry: object, params: list[torch.Tensor]) -> None:
    """CheckpointError unless `entry` is the state of parameter `index`: tensors, each a scalar (a step
    count) or of the parameter's shape, all finite."""
    if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(entry, dict):
        raise _unfit(source, f"state for a parameter {index!r} the model does not have")
    shape = params[index].shape
    for name, value in entry.items():
        if not isinstance(value, torch.Tensor) or (value.ndim != 0 and value.shape != shape):
            raise _unfit(source, f"{name!r} of parameter {index} does not fit its shape {tuple(shape)}")
        if not bool(torch.isfinite(value).all()):
            raise _unfit(source, f"{name!r} of parameter {index} is not finite")


def _unfit(source: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{source}'s optimizer state does not fit this run's policy ({why}); "
        "move the checkpoint away to start from version 0"
    )


def resume_updates(
    checkpoint_dir: Path | None, policy: CausalLM, config: GRPOConfig, updates: UpdatesFactory
) -> tuple[PolicyUpdates, int]:
    """`updates` of `policy` resumed from the checkpoint in `checkpoint_dir` (its weights, version, the
    updates' state and the optimizer's), or at version 0 without one, with the number of GRPO steps
    taken up to that version; CheckpointError if the checkpoint does not fit."""
    checkpoint = None if checkpoint_dir is None else load_rl_checkpoint(checkpoint_dir)
    if checkpoint_dir is None or checkpoint is None:
        return updates(policy, config, 0), 0
    path = checkpoint_dir / CHECKPOINT_NAME
    try:
        policy.load_state_dict(checkpoint.state)
    except Exception as exc:
        raise CheckpointError(
            f"{path} is not a usable checkpoint of this run's policy ({exc!r}); move it away to start from version 0"
        ) from None
    resumed = updates(policy, config, checkpoint.version)
    try:
        resumed.restore(checkpoint.updates)
        restore_optimizer(resumed.learner.optimizer, checkpoint.optimizer, source=path)
    except CheckpointError:
        resumed.close()
        raise
    logger.info("resumed from version %d after step %d (%s)", checkpoint.version, checkpoint.steps, path)
    return resumed, checkpoint.steps


def checkpoint_updates(
    checkpoint_dir: Path, updates: PolicyUpdates, state: dict[str, torch.Tensor], *, steps: int
) -> None:
    """Checkpoint `updates` at its newest version, whose weights are `state` and which took `steps`
    GRPO steps to make, for `resume_updates`."""
    save_rl_checkpoint(
        checkpoint_dir,
        RLCheckpoint(
            state=state,
            version=updates.version,
            updates=updates.saved_state(),
            optimizer=optimizer_state(updates.learner.optimizer),
            steps=steps,
        ),
    )
