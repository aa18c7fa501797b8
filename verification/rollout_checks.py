"""The per-rollout half of judging a group: claims, assignment, rollout verdict, recomputed reward.

For groups that passed the group-level checks (`verification.validator`), `check_groups` runs,
cheapest first:

1. for every rollout: strict conversion to a `RolloutClaim` (`malformed_claim`), the run's
   sampling parameters (`sampling_params`), the prompt and seed of the re-derived assignment
   (`prompt_mismatch`, `seed_mismatch`), a completion that ends where generation ends: at the
   task's `max_new_tokens`, or at its first stop token (`completion_length`: a completion cut
   anywhere else was cut where it scored best, and its proofs would still verify);
2. the rollout verdict (TOPLOC, seeded sampling, precision) for the claimed version, rollout
   after rollout, stopping at the first rejection (one batched prefill for the group:
   `RolloutVerifier.verify_groups` takes every group of a version at once);
3. the reward, recomputed with the task (a worker never reports one).

A group is accepted whole or not at all: GRPO normalizes rewards within a group, so a group a
worker could trim is biased. Once a rollout is rejected, the others are `group_rejected`.

Also here: the validator's reason codes beyond the verdict's `RejectReason`, and which of them
prove tampering (`BANNING_REASONS`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol import rollouts_pb2
from protocol.assignment import Assignment
from protocol.errors import InvalidMessage
from protocol.rollout_messages import (
    BANNED,
    GROUP_SIZE,
    STALE,
    UNKNOWN_VERSION,
    WRONG_VERSION,
    parse_rollout,
    rollout_hash,
)
from training.sampling import SamplingParams
from verification.rollout import RolloutClaim
from verification.rollout_wire import SAMPLING_PARAMS, WireRejection, claim_from_rollout
from verification.verdict import GroupClaims, RejectReason, RolloutVerifier

__all__ = [
    "BANNING_REASONS",
    "UNJUDGED_REASONS",
    "GroupJob",
    "GroupReason",
    "RewardTask",
    "RolloutItem",
    "check_groups",
    "parse_item",
]


class GroupReason(enum.StrEnum):
    """Rejection reasons of the validator, beyond the rollout verdict's `RejectReason`."""

    BANNED = BANNED
    REPLAY = "replay"
    """The ticket was judged already (or abandoned), or a rollout was accepted before."""
    NO_TICKET = "no_ticket"
    """This validator never issued the ticket the group names (ask it for tickets first)."""
    WRONG_VERSION = WRONG_VERSION
    """The group was generated with another policy version than its ticket fixes."""
    UNKNOWN_VERSION = UNKNOWN_VERSION
    WRONG_TASK = "wrong_task"
    GROUP_SIZE = GROUP_SIZE
    STALE = STALE
    SAMPLING_PARAMS = SAMPLING_PARAMS
    COMPLETION_LENGTH = "completion_length"
    GROUP_REJECTED = "group_rejected"
    """This rollout was fine or not looked at, but another rollout of its group was rejected."""
    REWARD_ERROR = "reward_error"
    """The task could not score a verified completion (a fault of the validator's task, not the worker)."""


BANNING_REASONS: frozenset[str] = frozenset(
    {
        RejectReason.MALFORMED_CLAIM,
        RejectReason.PROMPT_MISMATCH,
        RejectReason.SEED_MISMATCH,
        RejectReason.MALFORMED_PROOF,
        RejectReason.TOPLOC_EXPONENT,
        RejectReason.TOPLOC_SIGN,
        RejectReason.TOPLOC_MANTISSA,
        RejectReason.TOPLOC_VALUES,
        RejectReason.SAMPLING,
        GroupReason.SAMPLING_PARAMS,
        GroupReason.COMPLETION_LENGTH,
        GroupReason.WRONG_VERSION,
    }
)
"""Reasons that prove the worker ran something other than the protocol: honest software never
produces them. The others (stale, unknown version, replay, wrong task or size) are only counted."""

UNJUDGED_REASONS: frozenset[str] = frozenset(
    {GroupReason.BANNED, GroupReason.REPLAY, GroupReason.UNKNOWN_VERSION, GroupReason.NO_TICKET}
)
"""Group refusals that leave the ticket as it was: nothing was judged (the worker may resubmit once
unbanned, or once the validator holds the version), or there is no open ticket to close."""


class RewardTask(Protocol):
    """What the validator needs of a task; `training.tasks.Task` has this shape."""

    @property
    def name(self) -> str: ...

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def stop_ids(self) -> frozenset[int]: ...

    def prompt(self, prompt_seed: int) -> list[int]: ...

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float: ...


@dataclass
class RolloutItem:
    """One submitted rollout while its group is judged: what is known of it so far."""

    index: int
    hash: bytes
    rollout: rollouts_pb2.Rollout | None = None
    claim: RolloutClaim | None = None
    reason: str = ""
    """Empty while nothing is wrong with it."""
    detail: str = ""
    reward: float = 0.0

    @property
    def tokens(self) -> int:
        """Completion tokens it holds (0 if it could not be parsed)."""
        return len(self.rollout.completion_ids) if self.rollout is not None else 0

    def reject(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail


def parse_item(index: int, data: bytes) -> RolloutItem:
    """Hash and strictly parse the `index`-th serialized rollout of a group (a parse failure rejects it)."""
    item = RolloutItem(index=index, hash=rollout_hash(data))
    try:
        item.rollout = parse_rollout(data)
    except InvalidMessage as exc:
        item.reject(RejectReason.MALFORMED_CLAIM.value, str(exc))
    return item


@dataclass
class GroupJob:
    """A group that passed the group-level checks: its rollouts, its assignment and the verifier of its version."""

    items: Sequence[RolloutItem]
    assignment: Assignment
    verifier: RolloutVerifier


def check_groups(jobs: Sequence[GroupJob], *, task: RewardTask, sampling: SamplingParams) -> None:
    """Judge every item of each group generated for its assignment (sets each item's reason or reward),
    verifying the groups of each policy version in one batch.

    Every group is judged on its own (one group's rollouts never decide another's verdicts);
    batching only shares the cost of the verifier's passes.
    """
    prompts = [list(task.prompt(job.assignment.prompt_seed)) for job in jobs]
    for job, prompt in zip(jobs, prompts, strict=True):
        for item in job.items:
            if not item.reason:
                _precheck(item, task, sampling, job.assignment, prompt)
    ready = [g for g, job in enumerate(jobs) if not any(item.reason for item in job.items)]
    verifiers = {id(jobs[g].verifier): jobs[g].verifier for g in ready}
    for key, verifier in verifiers.items():
        same = [g for g in ready if id(jobs[g].verifier) == key]
        requests = []
        for g in same:
            claims = []
            for item in jobs[g].items:
                assert item.claim is not None  # every item without a reason has its claim
                claims.append(item.claim)
            seeds = [jobs[g].assignment.sampling_seeds[item.index] for item in jobs[g].items]
            requests.append(GroupClaims(claims, prompts[g], seeds))
        for g, verdicts in zip(same, verifier.verify_groups(requests), strict=True):
            # verdicts stop at the first rejection
            for item, verdict in zip(jobs[g].items, verdicts, strict=False):
                if not verdict.accepted:
                    item.reject(str(verdict.reason), verdict.detail)
    for job, prompt in zip(jobs, prompts, strict=True):
        if not any(item.reason for item in job.items):
            for item in job.items:
                _score(item, task, prompt)
        first = next((item for item in job.items if item.reason), None)
        if first is not None:
            for item in job.items:
                if not item.reason:
                    item.reject(
                        GroupReason.GROUP_REJECTED, f"rollout {first.index} of the group: {first.reason}"
                    )


def _precheck(
    item: RolloutItem, task: RewardTask, sampling: SamplingParams, assignment: Assignment, prompt: list[int]
) -> None:
    assert item.rollout is not None
    try:
        claim = claim_from_rollout(item.rollout, policy_version=assignment.policy_version, sampling=sampling)
    except WireRejection as r:
        item.reject(r.reason, r.detail)
        return
    if list(claim.prompt_ids) != prompt:
        item.reject(RejectReason.PROMPT_MISMATCH, "the prompt is not the one assigned for this counter")
    elif claim.seed != assignment.sampling_seeds[item.index]:
        item.reject(
            RejectReason.SEED_MISMATCH, f"seed {claim.seed} is not the one assigned to rollout {item.index}"
        )
    elif (problem := completion_length_problem(list(claim.completion_ids), task)) is not None:
        item.reject(GroupReason.COMPLETION_LENGTH, problem)
    else:
        item.claim = claim


def completion_length_problem(completion: list[int], task: RewardTask) -> str | None:
    """Why `completion` cannot be where the task's generation ends, or None if it can."""
    n, budget, stops = len(completion), task.max_new_tokens, task.stop_ids
    if n > budget:
        return f"{n} completion tokens, above the task's budget of {budget}"
    early = next((t for t in completion[:-1] if t in stops), None)
    if early is not None:
        return f"the completion goes on after the stop token {early} (generation stops there)"
    if n < budget and (not completion or completion[-1] not in stops):
        ending = " nor at a stop token" if stops else ""
        return f"{n} completion tokens: cut before the task's budget of {budget}{ending}"
    return None


def _score(item: RolloutItem, task: RewardTask, prompt: list[int]) -> None:
    assert item.claim is not None
    try:
        reward = float(task.reward(prompt, list(item.claim.completion_ids)))
    except Exception as exc:  # the task is ours, but a verified completion must never crash the validator
        item.reject(GroupReason.REWARD_ERROR, f"{type(exc).__name__}: {exc}")
        return
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        item.reject(GroupReason.REWARD_ERROR, f"the task scored {reward!r}, outside [0, 1]")
        return
    item.reward = reward
