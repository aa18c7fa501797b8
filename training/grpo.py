"""GRPO on scored rollouts: group-relative advantages and a clipped, token-level policy gradient.

Each prompt gets a group of G completions. A completion's advantage is its reward minus the
group's mean, over the group's standard deviation (all-equal rewards teach nothing: zeros).
The loss is the negative clipped surrogate, averaged over every completion token of the step:

    ratio = pi_theta(token) / pi_behaviour(token)
    objective = min(r' * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A)
    r' = min(ratio, negative_ratio_cap) if A < 0 else ratio

The extra cap on negative advantages is INTELLECT-2's two-sided clipping: PPO's min() lets a
token that the policy now makes far more likely than the behaviour policy did (large ratio) with
a negative advantage contribute an unbounded term; capping the ratio at delta bounds it.

Rollouts may come from older policy versions (asynchronous RL, level k = `async_level`): the
learner keeps the weights of its last k + 1 versions and recomputes each rollout's behaviour
log-probs with the weights that generated it. A rollout from a version older than
`version - k`, or from a version it never had, is refused with `StaleRolloutError` before
anything is computed. Log-probs come from the model's ordinary forward pass with the logits
divided by the sampling temperature (top-p truncation is not modelled, as is usual).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.nn import functional as F

from protocol.errors import HivenetError
from training.causal_lm import CausalLM
from training.sampling import SamplingParams

__all__ = [
    "GRPOConfig",
    "GRPOLearner",
    "GRPOStepReport",
    "ScoredRollout",
    "StaleRolloutError",
    "clipped_objective",
    "group_advantages",
]


class StaleRolloutError(HivenetError, ValueError):
    """A rollout's policy version is outside the learner's window (too old, unknown or from the future)."""


class GRPOConfig(BaseModel):
    """Hyper-parameters shared by the synchronous baseline and the swarm's trainer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_size: int = Field(default=8, ge=2)
    """Completions per prompt (G)."""
    groups_per_step: int = Field(default=4, ge=1)
    """Prompts (groups) per optimizer step."""
    lr: float = Field(default=3e-3, gt=0.0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradients are clipped to this global norm before each step."""
    clip_eps: float = Field(default=0.2, gt=0.0, lt=1.0)
    """PPO clip range: the ratio's effect is clipped to [1 - eps, 1 + eps]."""
    negative_ratio_cap: float = Field(default=4.0, gt=1.0)
    """INTELLECT-2's delta: for negative advantages the ratio is capped at this value."""
    async_level: int = Field(default=2, ge=0)
    """k: rollouts generated with versions version - k .. version are accepted."""
    temperature: float = Field(default=1.0, gt=0.0, le=100.0)
    """Sampling temperature (generation) and the temperature of the log-probs."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Sampling nucleus (generation only)."""
    advantage_eps: float = Field(default=1e-4, gt=0.0)
    """Added to the group's reward standard deviation before dividing."""

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters workers generate with."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p)


@dataclass
class ScoredRollout:
    """One completion with its reward and the policy version that generated it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    policy_version: int
    group_id: bytes
    """Rollouts of one group (same prompt, same version) share this id."""
    rollout_hash: bytes = b""
    """The verified rollout's hash (what its receipt names); lets a trainer prove what it trained on."""
    worker: bytes = b""
    """PeerID bytes of the worker that generated it."""


@dataclass(frozen=True)
class GRPOStepReport:
    """What one optimizer step saw and did."""

    version: int
    """Policy version of the weights after the step."""
    loss: float
    mean_reward: float
    num_rollouts: int
    num_tokens: int
    clipped_fraction: float
    """Fraction of tokens whose objective was clipped (no gradient through them)."""
    capped_fraction: float
    """Fraction of tokens whose ratio hit `negative_ratio_cap`."""
    max_lag: int
    """Largest `version - policy_version` among the rollouts."""
    grad_norm: float


def group_advantages(rewards: Sequence[float], eps: float = 1e-4) -> list[float]:
    """(reward - mean) / (std + eps) over one group (population std); all-equal rewards give zeros."""
    if not rewards:
        return []
    if max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, negative_ratio_cap: float
) -> torch.Tensor:
    """Per-token surrogate to maximise: min(r' A, clip(r, 1-eps, 1+eps) A), r' = min(r, delta) if A < 0."""
    capped = torch.where(advantages < 0, torch.clamp(ratio, max=negative_ratio_cap), ratio)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return torch.minimum(capped * advantages, clipped * advantages)


class GRPOLearner:
    """Owns the policy's optimizer and its recent versions; `step` applies one GRPO update."""

    def __init__(self, model: CausalLM, config: GRPOConfig, version: int = 0) -> None:
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        self.model = model
        self.config = config
        self.version = version
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.99)
        )
        self._history: dict[int, dict[str, torch.Tensor]] = {}
        self._scratch: CausalLM | None = None
        self._remember()

    def _remember(self) -> None:
        """Snapshot the current weights as `version`; forget versions outside the window."""
        self._history[self.version] = self.state_dict()
        oldest = self.version - self.config.async_level
        for v in [v for v in self._history if v < oldest or v > self.version]:
            del self._history[v]

    @property
    def known_versions(self) -> list[int]:
        """Versions whose weights the learner holds (it accepts rollouts from these)."""
        return sorted(self._history)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the current weights, on the CPU (what is published, checkpointed and kept)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights with `state` as `version`; older versions are forgotten."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        self.model.load_state_dict(state)
        self.version = version
        self._history.clear()
        self._remember()

    def check_versions(self, groups: Sequence[Sequence[ScoredRollout]]) -> None:
        """Raise StaleRolloutError unless every rollout's version is one whose weights are held."""
        for group in groups:
            for rollout in group:
                v = rollout.policy_version
                if v not in self._history:
                    raise StaleRolloutError(
                        f"rollout of policy version {v} refused: the learner is at version {self.version} "
                        f"with async level {self.config.async_level} and holds versions {self.known_versions}"
                    )

    def model_at(self, version: int) -> CausalLM:
        """A model holding the weights of a known `version` (a scratch copy, reloaded on every call)."""
        if version not in self._history:
            raise StaleRolloutError(f"version {version} is not held; known versions: {self.known_versions}")
        if self._scratch is None:
            self._scratch = copy.deepcopy(self.model)
        self._scratch.load_state_dict(self._history[version])
        return self._scratch

    def token_logprobs(self, model: CausalLM, rollouts: Sequence[ScoredRollout]) -> list[torch.Tensor]:
        """Log-probs (at the sampling temperature) of each rollout's completion tokens under `model`."""
        seqs = [r.prompt_ids + r.completion_ids[:-1] for r in rollouts]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=model.device)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long, device=model.device)
        start = min(len(r.prompt_ids) for r in rollouts) - 1
        logits, _ = model.forward_with_hidden(ids, outputs_from=start)
        logp = F.log_softmax(logits.float() / self.config.temperature, dim=-1)
        out = []
        for i, r in enumerate(rollouts):
            first = len(r.prompt_ids) - 1 - start
            rows = logp[i, first : first + len(r.completion_ids)]
            picked = torch.tensor(r.completion_ids, dtype=torch.long, device=rows.device)
            out.append(rows.gather(-1, picked[:, None])[:, 0])
        return out

    def step(self, groups: Sequence[Sequence[ScoredRollout]]) -> GRPOStepReport:
        """One optimizer step on `groups` (each: the rollouts of one prompt); version += 1."""
        if not groups or any(not g for g in groups):
            raise ValueError("step needs at least one group and no empty group")
        for group in groups:
            if len({r.group_id for r in group}) != 1:
                raise ValueError("the rollouts of one group must share one group_id")
        self.check_versions(groups)
        rollouts = [r for g in groups for r in g if r.completion_ids]
        if not rollouts:
            raise ValueError("step needs at least one rollout with a non-empty completion")
        advantage_of = {
            id(r): a
            for g in groups
            for r, a in zip(
                g, group_advantages([r.reward for r in g], self.config.advantage_eps), strict=True
            )
        }
        max_len = self.model.max_seq_len
        for r in rollouts:
            if len(r.prompt_ids) < 1 or len(r.prompt_ids) + len(r.completion_ids) - 1 > max_len:
                raise ValueError(
                    f"rollout of {len(r.prompt_ids)}+{len(r.completion_ids)} tokens does not fit"
                )

        with torch.no_grad():
            behaviour: dict[int, torch.Tensor] = {}
            for v in sorted({r.policy_version for r in rollouts} - {self.version}):
                batch = [r for r in rollouts if r.policy_version == v]
                for r, lp in zip(batch, self.token_logprobs(self.model_at(v), batch), strict=True):
                    behaviour[id(r)] = lp

        self.model.train()
        current = self.token_logprobs(self.model, rollouts)
        new_lp = torch.cat(current)
        # On-policy rollouts' behaviour log-probs are the current ones, detached: ratio exactly 1.
        old_lp = torch.cat(
            [behaviour.get(id(r), lp.detach()) for r, lp in zip(rollouts, current, strict=True)]
        )
        adv = torch.cat(
            [
                torch.full(
                    (len(r.completion_ids),), advantage_of[id(r)], dtype=torch.float32, device=new_lp.device
                )
                for r in rollouts
            ]
        )
        ratio = torch.exp(new_lp - old_lp)
        objective = clipped_objective(ratio, adv, self.config.clip_eps, self.config.negative_ratio_cap)
        loss = -objective.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.version += 1
        self._remember()

        with torch.no_grad():
            r_det = ratio.detach()
            outside = (r_det < 1 - self.config.clip_eps) & (adv < 0) | (r_det > 1 + self.config.clip_eps) & (
                adv > 0
            )
            capped = (r_det > self.config.negative_ratio_cap) & (adv < 0)
        all_rollouts = [r for g in groups for r in g]
        return GRPOStepReport(
            version=self.version,
            loss=float(loss.detach()),
            mean_reward=sum(r.reward for r in all_rollouts) / len(all_rollouts),
            num_rollouts=len(all_rollouts),
            num_tokens=int(new_lp.numel()),
            clipped_fraction=float(outside.float().mean()),
            capped_fraction=float(capped.float().mean()),
            max_lag=max(self.version - 1 - r.policy_version for r in all_rollouts),
            grad_norm=float(grad_norm),
        )
