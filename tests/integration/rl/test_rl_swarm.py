"""The RL loop on loopback: a seed, a trainer with its validator, an honest and a dishonest worker.

What must hold whatever the timing: the trainer steps only on rollouts its validator accepted,
publishes every version through the broadcast, workers follow it, and nothing the cheater
generated is ever trained on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from training.grpo import GRPOConfig
from training.model import ModelConfig, TinyGPT
from training.rl_run import RLRunConfig
from training.rl_worker import CheatMode
from verification.rl_simulation import simulate_rl

TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=96)


def tiny_run(steps: int, **grpo: int) -> RLRunConfig:
    settings = {"group_size": 4, "groups_per_step": 1, "async_level": 1} | grpo
    return RLRunConfig(run_id="rl-test", model=TINY, grpo=GRPOConfig(**settings), max_trainer_steps=steps)


def test_the_trainer_learns_only_from_verified_rollouts(tmp_path: Path) -> None:
    # an async level above the run's length: every group is judged on its content, none is stale
    config = tiny_run(2, async_level=4)
    cheaters = {1: CheatMode.PRECISION, 2: CheatMode.WEIGHTS}
    result = simulate_rl(
        config, TinyGPT(TINY), workers=3, cheaters=cheaters, min_groups_each=1, root=tmp_path
    )

    assert [s.version for s in result.steps] == [1, 2]
    assert all(s.published for s in result.steps)
    honest = result.groups["worker0"]
    assert sum(g.accepted for g in honest) >= 4 and not any(g.rejected for g in honest)
    assert result.trained_from["worker0"] == 8
    stats = result.validator_stats
    assert stats is not None
    for name in ("worker1", "worker2"):
        groups = [g for g in result.groups[name] if not g.error]
        assert groups and sum(g.accepted for g in groups) == 0
        assert not {reason for g in groups for reason in g.rejected} & {"stale", "replay", "unknown_version"}
        assert result.trained_from.get(name, 0) == 0
        assert stats.workers[result.worker_peers[name]].strikes >= 1

    # what each node's /metrics shows agrees with the validator's record
    trainer = result.metrics["trainer"]
    assert trainer.rollouts["accepted"] == stats.accepted
    assert trainer.rollouts["rejected"] == sum(trainer.rejections.values()) == sum(stats.rejected.values())
    assert result.metrics["worker0"].rollouts["generated"] >= 8
    # an RL trainer exports its GRPO steps, its policy version, reward and staleness, and the policy's
    # weight chunks count on both ends of the broadcast
    assert trainer.rl_steps == 2 and trainer.policy_version == result.steps[-1].version
    assert trainer.rl_reward == pytest.approx(result.steps[-1].mean_reward)
    assert trainer.rl_staleness == pytest.approx(result.steps[-1].mean_staleness)
    assert trainer.chunks_served > 0 and trainer.bytes_sent["broadcast"] > 0
    assert result.metrics["worker0"].chunks_fetched > 0 and result.metrics["worker0"].policy_version is None
