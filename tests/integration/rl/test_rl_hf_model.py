"""The RL loop with a Hugging Face model (`hivenet model init`'s llama, float32, native kernels):
the trainer, its validator and the workers all run it under limits calibrated on it, honest
rollouts verify, a cheater's do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.calibrated import calibrated
from training.grpo import GRPOConfig
from training.model_init import init_model_dir
from training.rl_run import RLRunConfig, initial_policy, run_task
from training.rl_worker import CheatMode
from training.run_model import HFModelRef
from training.tasks import TokenizedTask
from verification.rl_simulation import simulate_rl


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=20)


def test_an_rl_run_on_a_hugging_face_model_learns_only_from_verified_rollouts(
    model_dir: Path, tmp_path: Path
) -> None:
    config = calibrated(
        RLRunConfig(
            run_id="rl-hf",
            hf_model=HFModelRef.of_directory(model_dir),
            grpo=GRPOConfig(group_size=4, groups_per_step=1, async_level=4),
            max_trainer_steps=2,
        )
    )
    assert config.run_verification.model == config.hf_model.weights_sha256 if config.hf_model else False
    task = run_task(config)
    assert isinstance(task, TokenizedTask) and task.stop_ids >= task.tokenizer.stop_ids
    result = simulate_rl(
        config,
        initial_policy(config),
        workers=2,
        cheaters={1: CheatMode.WEIGHTS},
        min_groups_each=1,
        root=tmp_path,
    )
    assert [s.version for s in result.steps] == [1, 2] and all(s.published for s in result.steps)
    honest = result.groups["worker0"]
    assert sum(g.accepted for g in honest) >= 4 and not any(g.rejected for g in honest)
    cheater = [g for g in result.groups["worker1"] if not g.error]
    assert cheater and sum(g.accepted for g in cheater) == 0
    assert result.trained_from.get("worker1", 0) == 0
