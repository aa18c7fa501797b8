"""An RL trainer's checkpoint: a resumed trainer makes the update the uninterrupted one would have made
(weights, version, the updates' state and the optimizer's moments all come back); a checkpoint from
before the optimizer was saved still loads; a file that is not a usable checkpoint is a clear error.

`resume_updates` and `checkpoint_updates` are what `RLTrainer` resumes and checkpoints with."""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

import pytest
import torch

from tests.helpers.broadcast import assert_state_dicts_equal
from tests.helpers.rl_diloco import LoneAverager, scored_groups
from training.causal_lm import CausalLM
from training.checkpoint import CheckpointError
from training.grpo import GRPOConfig, ScoredRollout
from training.model import ModelConfig, TinyGPT
from training.policy_updates import PolicyUpdates, UpdatesFactory, every_step_updates
from training.rl_checkpoint import (
    CHECKPOINT_NAME,
    checkpoint_updates,
    load_rl_checkpoint,
    optimizer_state,
    resume_updates,
)
from training.rl_diloco import DiLoCoUpdates, OuterVersionLearner
from training.rl_run import RLDiLoCoConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64)
GRPO = GRPOConfig(group_size=4, groups_per_step=2, lr=1e-2, weight_decay=0.01)


def _policy(seed: int) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(SMALL)


def _batch(seed: int, version: int) -> list[list[ScoredRollout]]:
    return scored_groups(seed, version, groups=GRPO.groups_per_step, group_size=GRPO.group_size)


def _lone_diloco(policy: CausalLM, grpo: GRPOConfig, version: int) -> PolicyUpdates:
    """DiLoCo with H=1 and no other trainer: every GRPO step is an outer step, with outer momentum."""
    learner = OuterVersionLearner(policy, grpo, inner_steps=1, outer_version=version)
    return DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=1), LoneAverager())


def _train(directory: Path, updates: UpdatesFactory, steps: int) -> PolicyUpdates:
    """A trainer that took `steps` steps, checkpointing each version as `RLTrainer` does."""
    running, taken = resume_updates(directory, _policy(0), GRPO, updates)
    assert running.version == 0 and taken == 0
    for step in range(steps):
        running.step(_batch(step, running.version))
        checkpoint_updates(directory, running, running.learner.state_dict(), steps=step + 1)
    return running


@pytest.mark.parametrize("updates", [every_step_updates, _lone_diloco], ids=["every-step", "diloco"])
def test_a_resumed_trainer_makes_the_update_the_uninterrupted_one_makes(
    tmp_path: Path, updates: UpdatesFactory
) -> None:
    running = _train(tmp_path, updates, steps=3)
    resumed, steps = resume_updates(
        tmp_path, _policy(1), GRPO, updates
    )  # other random weights: all from the file
    assert resumed.version == running.version == 3
    assert steps == 3  # its next step is numbered as the uninterrupted trainer's
    assert_state_dicts_equal(resumed.learner.state_dict(), running.learner.state_dict())

    batch = _batch(99, 3)
    for trainer in (running, resumed):
        trainer.step(batch)
    assert_state_dicts_equal(resumed.learner.state_dict(), running.learner.state_dict())
    assert not list(tmp_path.glob("*.tmp"))


def test_the_optimizer_keeps_the_runs_settings_not_the_checkpoints(tmp_path: Path) -> None:
    _train(tmp_path, every_step_updates, steps=1)
    faster = GRPO.model_copy(update={"lr": 5e-2})
    resumed, _ = resume_updates(tmp_path, _policy(1), faster, every_step_updates)
    assert [group["lr"] for group in resumed.learner.optimizer.param_groups] == [5e-2]
    assert resumed.learner.optimizer.state  # the moments came back


def test_a_checkpoint_without_optimizer_state_loads_with_a_fresh_optimizer_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = _policy(0).state_dict()
    torch.save({"state": weights, "version": 2, "updates": {}}, tmp_path / CHECKPOINT_NAME)  # the old format
    with caplog.at_level(logging.WARNING):
        resumed, steps = resume_updates(tmp_path, _policy(1), GRPO, every_step_updates)
    assert resumed.version == 2 and not resumed.learner.optimizer.state and steps == 0
    assert_state_dicts_equal(resumed.learner.state_dict(), weights)
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "no optimizer state" in warning.getMessage()
    resumed.step(_batch(0, 2))  # and it trains on


def _write(directory: Path, saved: object) -> None:
    torch.save(saved, directory / CHECKPOINT_NAME)


def test_unreadable_or_malformed_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    weights = _policy(0).state_dict()
    cases: list[tuple[object, str]] = [
        ([1, 2, 3], "holds a list"),
        ({"state": weights, "version": "3", "updates": {}}, "not a version number"),
        ({"state": weights, "version": -1, "updates": {}}, "not a version number"),
        ({"state": {"w": 1.0}, "version": 3, "updates": {}}, "weights are not a mapping"),
        ({"state": weights, "version": 3, "updates": [torch.zeros(1)]}, "updates state are not"),
        ({"state": weights, "version": 3, "updates": {}, "optimizer": [1]}, "optimizer state is not"),
        ({"state": weights, "version": 3, "updates": {}, "steps": -2}, "not a number of steps"),
        ({"state": weights, "version": 3, "updates": {}, "steps": 2.5}, "not a number of steps"),
    ]
    for saved, message in cases:
        _write(tmp_path, saved)
        with pytest.raises(CheckpointError, match=message) as refused:
            load_rl_checkpoint(tmp_path)
        assert "move it away" in str(refused.value)

    (tmp_path / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read it"):
        load_rl_checkpoint(tmp_path)
    _write(tmp_path, {"state": weights, "version": 3, "updates": {}, "code": PurePosixPath("/etc")})
    with pytest.raises(CheckpointError, match="cannot read it"):  # no arbitrary objects unpickled
        load_rl_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_NAME).unlink()
    assert load_rl_checkpoint(tmp_path) is None


def test_optimizer_state_that_does_not_fit_the_policy_is_a_clear_error(tmp_path: Path) -> None:
    trained = _train(tmp_path, every_step_updates, steps=1)
    good = optimizer_state(trained.learner.optimizer)
    weights = trained.learner.state_dict()

    def tampered(index: object, name: str, value: object) -> dict[str, object]:
        state = {i: dict(entry) for i, entry in good["state"].items()}
        state.setdefault(index, {})[name] = value  # type: ignore[call-overload]
        return {"state": state, "param_groups": good["param_groups"]}

    first = good["state"][0]["exp_avg"]
    cases: list[tuple[object, str]] = [
        ({"param_groups": good["param_groups"]}, "no per-parameter state"),
        (tampered(10_000, "exp_avg", first), "a parameter 10000 the model does not have"),
        (tampered(0, "exp_avg", torch.zeros(3, 3, 3)), "does not fit its shape"),
        (tampered(0, "exp_avg", 0.5), "does not fit its shape"),
        (tampered(0, "exp_avg_sq", torch.full_like(first, float("nan"))), "not finite"),
    ]
    for optimizer, message in cases:
        _write(tmp_path, {"state": weights, "version": 1, "updates": {}, "optimizer": optimizer})
        with pytest.raises(CheckpointError, match=message):
            resume_updates(tmp_path, _policy(1), GRPO, every_step_updates)
