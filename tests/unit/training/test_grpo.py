"""Tests for training.grpo: advantages, the two-sided clipped objective, updates and the version window."""

from __future__ import annotations

import copy

import pytest
import torch

from training.causal_lm import CausalLM
from training.grpo import (
    GRPOConfig,
    GRPOLearner,
    ScoredRollout,
    StaleRolloutError,
    clipped_objective,
    group_advantages,
)
from training.model import ModelConfig, TinyGPT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64)
PROMPT = list(b"Write 4 letters:\n")
GOOD = list(b"abcd\n")
BAD = list(b"xyzxyzxyz\n")


def make_learner(**overrides: object) -> GRPOLearner:
    torch.manual_seed(0)
    return GRPOLearner(TinyGPT(SMALL), GRPOConfig(**overrides))  # type: ignore[arg-type]


def group(version: int, gid: bytes = b"g") -> list[ScoredRollout]:
    return [
        ScoredRollout(PROMPT, GOOD, 1.0, version, gid),
        ScoredRollout(PROMPT, BAD, 0.0, version, gid),
    ]


def logprob_sum(learner: GRPOLearner, model: CausalLM, completion: list[int]) -> float:
    with torch.no_grad():
        (lp,) = learner.token_logprobs(model, [ScoredRollout(PROMPT, completion, 0.0, 0, b"x")])
    return float(lp.sum())


def test_group_advantages():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    a = 0.5 / (0.5 + 1e-4)  # mean 0.5, population std 0.5, eps 1e-4
    assert adv == pytest.approx([a, -a, -a, a])
    assert group_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]  # mean of equal floats may not be exact
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([]) == []
    three = group_advantages([0.0, 0.5, 1.0], eps=0.0)
    assert three == pytest.approx([-(1.5**0.5), 0.0, 1.5**0.5])
    assert sum(group_advantages([0.2, 0.9, 0.4, 0.4])) == pytest.approx(0.0, abs=1e-9)


def test_clipped_objective_hand_values_and_gradients():
    ratio = torch.tensor([1.5, 0.5, 0.5, 2.0, 10.0, 10.0, 1.1], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 2.0, -1.0])
    obj = clipped_objective(ratio, adv, clip_eps=0.2, negative_ratio_cap=4.0)
    # min(r' A, clip(r) A):  r=1.5,A=1 -> 1.2 | r=.5,A=1 -> .5 | r=.5,A=-1 -> -.8 | r=2,A=-1 -> -2
    # r=10,A=-1 -> capped at 4: -4 (plain PPO: -10) | r=10,A=2 -> 2.4 | r=1.1,A=-1 -> -1.1 (inside the clip range)
    assert obj.tolist() == pytest.approx([1.2, 0.5, -0.8, -2.0, -4.0, 2.4, -1.1])
    obj.sum().backward()
    # Gradient flows only where the unclipped, uncapped term is the one selected.
    assert ratio.grad is not None
    assert ratio.grad.tolist() == pytest.approx([0.0, 1.0, 0.0, -1.0, 0.0, 0.0, -1.0])
    plain = clipped_objective(torch.tensor([10.0]), torch.tensor([-1.0]), 0.2, negative_ratio_cap=1e9)
    assert plain.item() == pytest.approx(-10.0)


def test_step_raises_positive_and_lowers_negative_completions():
    learner = make_learner(lr=1e-2)
    good0 = logprob_sum(learner, learner.model, GOOD)
    bad0 = logprob_sum(learner, learner.model, BAD)
    report = learner.step([group(0)])
    assert learner.version == 1 and report.version == 1
    assert report.num_rollouts == 2 and report.num_tokens == len(GOOD) + len(BAD)
    assert report.mean_reward == 0.5 and report.max_lag == 0
    assert logprob_sum(learner, learner.model, GOOD) > good0
    assert logprob_sum(learner, learner.model, BAD) < bad0


def test_equal_rewards_teach_nothing():
    learner = make_learner()
    before = copy.deepcopy(learner.model.state_dict())
    flat = [ScoredRollout(PROMPT, GOOD, 0.3, 0, b"g"), ScoredRollout(PROMPT, BAD, 0.3, 0, b"g")]
    report = learner.step([flat])
    assert report.loss == 0.0 and report.grad_norm == 0.0
    after = learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_stale_rollouts_use_their_own_weights_and_old_ones_are_refused():
    learner = make_learner(async_level=2, lr=1e-2)
    initial = copy.deepcopy(learner.model)
    for _ in range(2):
        learner.step([group(learner.version)])
    assert learner.known_versions == [0, 1, 2]
    # The behaviour log-probs of a version-0 rollout come from version 0's weights.
    assert logprob_sum(learner, learner.model_at(0), GOOD) == pytest.approx(
        logprob_sum(learner, initial, GOOD)
    )
    assert logprob_sum(learner, learner.model, GOOD) != pytest.approx(logprob_sum(learner, initial, GOOD))
    report = learner.step([group(0), group(2, b"h")])
    assert report.max_lag == 2 and learner.version == 3
    assert learner.known_versions == [1, 2, 3]

    weights = copy.deepcopy(learner.model.state_dict())
    for version in (0, 4):  # older than version - k, and from the future
        with pytest.raises(StaleRolloutError, match=f"policy version {version} refused"):
            learner.step([group(3), group(version, b"old")])
    assert learner.version == 3
    assert all(torch.equal(weights[k], v) for k, v in learner.model.state_dict().items())


def test_async_level_zero_is_on_policy_only():
    learner = make_learner(async_level=0)
    learner.step([group(0)])
    with pytest.raises(StaleRolloutError):
        learner.step([group(0)])
    learner.step([group(1)])


def test_load_state_dict_sets_the_version_and_forgets_older_weights():
    learner = make_learner()
    other = TinyGPT(SMALL)
    learner.load_state_dict(other.state_dict(), version=7)
    assert learner.version == 7 and learner.known_versions == [7]
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in learner.state_dict().items())
    with pytest.raises(StaleRolloutError):
        learner.step([group(6)])
    assert learner.step([group(7)]).version == 8


def test_malformed_batches_are_refused():
    learner = make_learner()
    with pytest.raises(ValueError, match="group_id"):
        learner.step([[ScoredRollout(PROMPT, GOOD, 1.0, 0, b"a"), ScoredRollout(PROMPT, BAD, 0.0, 0, b"b")]])
    with pytest.raises(ValueError):
        learner.step([])
    too_long = [ScoredRollout(PROMPT, [97] * 60, 1.0, 0, b"g"), ScoredRollout(PROMPT, BAD, 0.0, 0, b"g")]
    with pytest.raises(ValueError, match="does not fit"):
        learner.step([too_long])
    assert learner.version == 0
