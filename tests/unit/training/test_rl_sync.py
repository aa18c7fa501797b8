"""Tests for training.rl_sync: the cached pretrained policy and the synchronous GRPO baseline."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch

from training.data import DataConfig
from training.generation import generate
from training.grpo import GRPOConfig, GRPOStepReport
from training.model import ModelConfig, TinyGPT
from training.rl_sync import pretrained_policy, rollout_seed, run_sync_grpo
from training.tasks import Task, get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64)
STDLIB = DataConfig(source="stdlib", max_corpus_bytes=200_000, seq_len=32, batch_size=4)


def same_weights(a: TinyGPT, b: TinyGPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_pretrained_policy_is_the_same_whatever_the_callers_thread_count(tmp_path):
    # a multi-threaded reduction sums in another order: the cache would keep whichever came first
    data = DataConfig(source="stdlib", max_corpus_bytes=200_000, seq_len=64, batch_size=16)
    policies = []
    for threads in (2, 1):
        torch.set_num_threads(threads)
        policies.append(pretrained_policy(steps=3, seed=0, data=data, cache_dir=tmp_path / str(threads)))
    assert torch.get_num_threads() == 1  # the caller's setting is back
    assert same_weights(*policies)


def test_pretrained_policy_is_cached_by_its_settings(tmp_path):
    first = pretrained_policy(SMALL, steps=3, seed=1, data=STDLIB, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("tinygpt-*.pt"))) == 1
    again = pretrained_policy(SMALL, steps=3, seed=1, data=STDLIB, cache_dir=tmp_path)
    assert same_weights(first, again)
    other_seed = pretrained_policy(SMALL, steps=3, seed=2, data=STDLIB, cache_dir=tmp_path)
    assert not same_weights(first, other_seed)
    pretrained_policy(SMALL, steps=4, seed=1, data=STDLIB, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("tinygpt-*.pt"))) == 3
    # Training changed the weights away from the seeded initialisation.
    torch.manual_seed(1)
    assert not same_weights(first, TinyGPT(SMALL))


def test_an_unreadable_cache_file_is_retrained(tmp_path):
    first = pretrained_policy(SMALL, steps=2, seed=0, data=STDLIB, cache_dir=tmp_path)
    (path,) = tmp_path.glob("tinygpt-*.pt")
    path.write_bytes(b"torn")
    again = pretrained_policy(SMALL, steps=2, seed=0, data=STDLIB, cache_dir=tmp_path)
    assert same_weights(first, again)


def test_rollout_seeds_are_deterministic_and_distinct():
    seeds = {rollout_seed(0, s, g, i) for s in range(3) for g in range(3) for i in (None, 0, 1)}
    assert len(seeds) == 27
    assert rollout_seed(5, 1, 2, 3) == rollout_seed(5, 1, 2, 3) != rollout_seed(6, 1, 2, 3)
    assert all(0 <= s < 2**64 for s in seeds)


@dataclass(frozen=True)
class LowBytesTask:
    """A test task any random model earns varied rewards on: the share of bytes below the prompt's byte."""

    name: str = "low-bytes"
    max_new_tokens: int = 6
    stop_ids: frozenset[int] = frozenset()

    def prompt(self, prompt_seed: int) -> list[int]:
        return [64 + prompt_seed % 128]

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        return sum(t < prompt_ids[0] for t in completion_ids) / self.max_new_tokens


def record(into: list[GRPOStepReport], _step: int, report: GRPOStepReport) -> None:
    into.append(report)


def test_sync_grpo_is_deterministic_and_trains_the_model_in_place():
    task = LowBytesTask()
    assert isinstance(task, Task)
    config = GRPOConfig(group_size=3, groups_per_step=2)
    torch.manual_seed(0)
    start = TinyGPT(SMALL)
    runs = []
    for _ in range(2):
        model = TinyGPT(SMALL)
        model.load_state_dict(start.state_dict())
        reports: list[GRPOStepReport] = []
        curve = run_sync_grpo(task, config, 2, 0, model, on_step=functools.partial(record, reports))
        assert [r.version for r in reports] == [1, 2] and len(curve) == 2
        assert curve == [r.mean_reward for r in reports]
        assert all(0.0 <= r <= 1.0 for r in curve) and max(curve) > 0.0
        runs.append((curve, model))
    assert runs[0][0] == runs[1][0]
    assert same_weights(runs[0][1], runs[1][1])
    assert not same_weights(runs[0][1], start)


HELD_OUT_RUN = 10_000
"""The seed run of the held-out prompts and sampling seeds (training uses runs 0 and 1)."""


def _held_out_reward(
    model: TinyGPT, task: Task, config: GRPOConfig, prompts: int = 16, samples: int = 8
) -> float:
    """Mean reward of `model` on fixed held-out prompts, each sampled with fixed seeds."""
    rewards = []
    for g in range(prompts):
        prompt = task.prompt(rollout_seed(HELD_OUT_RUN, 0, g))
        for i in range(samples):
            out = generate(
                model, prompt, task.max_new_tokens, config.sampling, rollout_seed(HELD_OUT_RUN, 0, g, i),
                stop_ids=task.stop_ids, prove=False,
            )  # fmt: skip
            rewards.append(task.reward(prompt, out.completion_ids))
    return sum(rewards) / len(rewards)


@pytest.mark.slow
def test_sync_grpo_improves_the_pretrained_policy_on_line_length():
    """At a stable learning rate, 60 steps raise the reward on held-out prompts well above the start.

    The reward is measured before and after training on the same held-out prompts and sampling
    seeds, and averaged over two training runs. The training curve (a few fresh prompts a step)
    is too noisy to judge one run by: judged on it, one run passed on one CPU and failed on another,
    whose float rounding sent the same seed down another trajectory. At the default lr (3e-3) the
    synchronous loop is unstable: for some seeds its reward rises, then collapses to 0
    (bench/rl.py's docstring); the swarm's off-policy clipping keeps it stable.
    """
    task, config = get_task("line-length"), GRPOConfig(lr=1e-3)
    before, after = [], []
    for seed in (0, 1):
        model = pretrained_policy()
        before.append(_held_out_reward(model, task, config))
        run_sync_grpo(task, config, 60, seed, model)
        after.append(_held_out_reward(model, task, config))
    early, late = sum(before) / len(before), sum(after) / len(after)
    assert late > early + 0.1, (before, after)
    assert late > 0.25, (before, after)
