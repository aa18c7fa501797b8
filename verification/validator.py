"""The validator of a decentralized RL run: judges workers' rollout groups and signs a receipt for each rollout.

`Validator.judge_group(worker, group)` takes a `RolloutGroup` whose envelope the transport has
already verified as signed by `worker`, and decides, in order:

1. group level (every rollout of the group gets the same reason): the worker is banned
   (`banned`); its assignment counter was judged already (`replay`) or written off long ago
   (`abandoned`); the policy version is not held and never was (`unknown_version`; the worker
   may resubmit once this validator holds it); the task is not the run's (`wrong_task`); the
   group does not hold `group_size` rollouts (`group_size`); the version is more than
   `async_level` behind the trainer or already dropped (`stale`); a rollout was submitted
   before (`replay`);
2. per rollout, cheap checks first for every rollout: strict parse and conversion to a
   `RolloutClaim` (`malformed_claim`), the run's sampling parameters (`sampling_params`), the
   prompt and seed re-derived from the assignment (`prompt_mismatch`, `seed_mismatch`), a
   completion of exactly the task's `max_new_tokens` (`completion_length`: a worker cannot cut
   a completion where it scores best);
3. then the rollout verdict (TOPLOC, seeded sampling, precision) of `verification.verdict` for
   the claimed version, rollout after rollout;
4. the reward, recomputed with the task (a worker never reports one).

A group is accepted whole or not at all: GRPO normalizes rewards within a group, so a group
a worker could trim is biased. After the first failing rollout the rest are not verified and
are rejected as `group_rejected`. Rejections that prove tampering (`BANNING_REASONS`) ban the
worker, for longer each time; staleness, unknown versions and replays are only counted.

Every judged group uses its assignment counter; a worker's skipped counters are counted as
abandoned assignments (`verification.worker_accounts`). Each verdict is a `RolloutVerdict`
sealed in an envelope signed by the validator: the worker's receipt, valid for 30 days.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.bans import BanList
from protocol import rollouts_pb2
from protocol.assignment import Assignment, derive_assignment
from protocol.envelope import seal
from training.model import TinyGPT
from training.sampling import SamplingParams
from verification.policy import DEFAULT_POLICY, VerificationPolicy
from verification.policy_window import PolicyWindow, VersionStatus
from verification.rollout import RolloutClaim
from verification.rollout_wire import (
    SAMPLING_PARAMS,
    WireRejection,
    claim_from_rollout,
    parse_rollout_bytes,
    rollout_hash,
)
from verification.verdict import RejectReason, RolloutVerifier
from verification.worker_accounts import DEFAULT_LATE_WINDOW, ValidatorStats, WorkerAccounts

__all__ = [
    "BANNING_REASONS",
    "RECEIPT_TTL_S",
    "VERDICT_DOMAIN",
    "GroupReason",
    "RewardTask",
    "Validator",
    "ValidatorStats",
    "VerifiedRollout",
]

VERDICT_DOMAIN = "rollout-verdict"
"""Envelope domain of a verdict (`protocol.rollout_messages.DOMAIN_VERDICT` once that lands)."""

RECEIPT_TTL_S = 30 * 24 * 3600.0
"""How long a verdict's signature stays valid: a receipt is shown long after the rollout."""

MAX_DETAIL_CHARS = 400
"""A verdict's detail is cut to this, so a sealed verdict stays far below the envelope size limit."""


class GroupReason(enum.StrEnum):
    """Rejection reasons of the validator, beyond the rollout verdict's `RejectReason`."""

    BANNED = "banned"
    REPLAY = "replay"
    ABANDONED = "abandoned"
    """The counter is so far behind the worker's highest that it was written off."""
    UNKNOWN_VERSION = "unknown_version"
    WRONG_TASK = "wrong_task"
    GROUP_SIZE = "group_size"
    STALE = "stale"
    SAMPLING_PARAMS = SAMPLING_PARAMS
    COMPLETION_LENGTH = "completion_length"
    GROUP_REJECTED = "group_rejected"
    """This rollout was fine or not looked at, but another rollout of its group was rejected."""
    REWARD_ERROR = "reward_error"
    """The task could not score a verified completion (a fault of the validator's task, not the worker)."""


BANNING_REASONS = frozenset(
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
    }
)
"""Reasons that prove the worker ran something other than the protocol: honest software never
produces them."""

# Refusals that leave the counter open: nothing was judged (the worker may resubmit the group
# once unbanned or once this validator holds the version), or the counter is settled already.
_NOT_JUDGED = frozenset(
    {GroupReason.BANNED, GroupReason.REPLAY, GroupReason.ABANDONED, GroupReason.UNKNOWN_VERSION}
)


class RewardTask(Protocol):
    """What the validator needs of a task; `training.tasks.Task` has this shape."""

    name: str
    max_new_tokens: int

    def prompt(self, prompt_seed: int) -> list[int]: ...

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float: ...


@dataclass
class VerifiedRollout:
    """An accepted rollout, with the reward the validator recomputed: what the trainer learns from."""

    worker: bytes
    rollout_hash: bytes
    policy_version: int
    counter: int
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float


@dataclass
class _Item:
    """One submitted rollout while its group is judged."""

    index: int
    hash: bytes
    rollout: rollouts_pb2.Rollout | None = None
    claim: RolloutClaim | None = None
    reason: str = ""
    detail: str = ""
    reward: float = 0.0

    @property
    def tokens(self) -> int:
        return len(self.rollout.completion_ids) if self.rollout is not None else 0

    def reject(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail


def _parse(index: int, data: bytes) -> _Item:
    item = _Item(index=index, hash=rollout_hash(data))
    try:
        item.rollout = parse_rollout_bytes(data)
    except WireRejection as r:
        item.reject(r.reason, r.detail)
    return item


class Validator:
    """Judges rollout groups of one run, for its policy versions in the async window; thread-safe."""

    def __init__(
        self,
        *,
        private_key: Ed25519PrivateKey,
        run_id: str,
        task: RewardTask,
        group_size: int,
        async_level: int = 2,
        policy: VerificationPolicy = DEFAULT_POLICY,
        bans: BanList | None = None,
        clock: Callable[[], float] = time.time,
        sampling: SamplingParams | None = None,
        receipt_ttl_s: float = RECEIPT_TTL_S,
        late_window: int = DEFAULT_LATE_WINDOW,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.run_id = run_id
        self.task = task
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.bans = bans or BanList(base_s=60.0, max_s=24 * 3600.0, owner="validator")
        self.receipt_ttl_s = receipt_ttl_s
        self._key = private_key
        self._clock = clock
        self._window = PolicyWindow(async_level, policy)
        self._accounts = WorkerAccounts(late_window)
        self._lock = threading.Lock()
        self._seq = int(clock() * 1e6)

    # --- policy versions ---

    def add_version(self, version: int, model: TinyGPT) -> None:
        """Hold `version` (a private copy of `model`), dropping versions beyond the newest async_level + 1."""
        with self._lock:
            self._window.add(version, model)

    def set_trainer_step(self, step: int) -> None:
        """The trainer's current step: groups of versions older than `step - async_level` are stale."""
        with self._lock:
            self._window.trainer_step = step

    @property
    def held_versions(self) -> list[int]:
        with self._lock:
            return self._window.held

    # --- judging ---

    def judge_group(
        self, worker: bytes, group: rollouts_pb2.RolloutGroup
    ) -> tuple[list[bytes], list[VerifiedRollout]]:
        """Sealed verdicts (one per rollout, at most `group_size`) and the accepted rollouts (all or none)."""
        version, counter = int(group.policy_version), int(group.counter)
        items = [_parse(i, data) for i, data in enumerate(group.rollouts[: self.group_size])]
        with self._lock:
            refusal, verifier = self._refusal(worker, group, items)
            if refusal is None or refusal[0] not in _NOT_JUDGED:
                self._accounts.use_counter(worker, counter)
        if refusal is not None:
            for item in items:
                item.reject(*refusal)
        else:
            assert verifier is not None
            self._judge_rollouts(worker, version, counter, items, verifier)
        accepted = refusal is None and all(not item.reason for item in items)
        with self._lock:
            if accepted:
                # Only accepted rollouts: remembering rejected ones would let whoever saw a worker's
                # rollouts burn them by submitting them first under another identity.
                self._window.remember_hashes(version, [item.hash for item in items])
            failure = next((item for item in items if item.reason in BANNING_REASONS), None)
            if failure is not None:
                duration = self.bans.ban(worker, f"{failure.reason}: {failure.detail}")
                self._accounts.record_ban(worker, self._clock() + duration)
            for item in items:
                self._accounts.record(worker, accepted, item.reason, item.tokens)
        verdicts = self._seal(worker, version, counter, items, accepted)
        if not accepted:
            return verdicts, []
        return verdicts, [
            VerifiedRollout(
                worker=worker,
                rollout_hash=item.hash,
                policy_version=version,
                counter=counter,
                index=item.index,
                prompt_ids=list(item.claim.prompt_ids),
                completion_ids=list(item.claim.completion_ids),
                reward=item.reward,
            )
            for item in items
            if item.claim is not None
        ]

    def _refusal(
        self, worker: bytes, group: rollouts_pb2.RolloutGroup, items: list[_Item]
    ) -> tuple[tuple[str, str] | None, RolloutVerifier | None]:
        """The group-level rejection, if any, else the verifier of the group's version (lock held)."""
        version, counter = int(group.policy_version), int(group.counter)
        if self.bans.is_banned(worker):
            return (GroupReason.BANNED, "this worker is banned"), None
        status = self._accounts.counter_status(worker, counter)
        if status == "used":
            return (GroupReason.REPLAY, f"assignment counter {counter} was already judged"), None
        if status == "written_off":
            return (GroupReason.ABANDONED, f"assignment counter {counter} was written off as abandoned"), None
        standing = self._window.classify(version)
        if standing.status is VersionStatus.UNKNOWN:
            return (GroupReason.UNKNOWN_VERSION, standing.detail), None
        if group.task != self.task.name:
            return (
                GroupReason.WRONG_TASK,
                f"group is for task {group.task!r}, the run's is {self.task.name!r}",
            ), None
        if len(group.rollouts) != self.group_size:
            return (
                GroupReason.GROUP_SIZE,
                f"{len(group.rollouts)} rollouts, the run's groups hold {self.group_size}",
            ), None
        if standing.status is VersionStatus.STALE:
            return (GroupReason.STALE, standing.detail), None
        hashes = [item.hash for item in items]
        for item in items:
            if self._window.seen_hash(item.hash) or hashes.count(item.hash) > 1:
                return (GroupReason.REPLAY, f"rollout {item.index} was submitted before"), None
        return None, standing.verifier

    def _judge_rollouts(
        self, worker: bytes, version: int, counter: int, items: list[_Item], verifier: RolloutVerifier
    ) -> None:
        """Per-rollout checks, cheapest first; stops at the first rejected rollout (lock not held)."""
        assignment = derive_assignment(self.run_id, version, worker, counter, self.group_size)
        prompt = list(self.task.prompt(assignment.prompt_seed))
        for item in items:
            if not item.reason:
                self._precheck(item, version, assignment, prompt)
        if not any(item.reason for item in items):
            for item in items:
                assert item.claim is not None
                verdict = verifier.verify(
                    item.claim,
                    assigned_prompt_ids=prompt,
                    assigned_seed=assignment.sampling_seeds[item.index],
                )
                if not verdict.accepted:
                    item.reject(str(verdict.reason), verdict.detail)
                    break
        if not any(item.reason for item in items):
            for item in items:
                self._score(item, prompt)
        first = next((item for item in items if item.reason), None)
        if first is not None:
            for item in items:
                if not item.reason:
                    item.reject(
                        GroupReason.GROUP_REJECTED, f"rollout {first.index} of the group: {first.reason}"
                    )

    def _precheck(self, item: _Item, version: int, assignment: Assignment, prompt: list[int]) -> None:
        assert item.rollout is not None
        try:
            claim = claim_from_rollout(item.rollout, policy_version=version, sampling=self.sampling)
        except WireRejection as r:
            item.reject(r.reason, r.detail)
            return
        if list(claim.prompt_ids) != prompt:
            item.reject(RejectReason.PROMPT_MISMATCH, "the prompt is not the one assigned for this counter")
        elif claim.seed != assignment.sampling_seeds[item.index]:
            item.reject(
                RejectReason.SEED_MISMATCH,
                f"seed {claim.seed} is not the one assigned to rollout {item.index}",
            )
        elif len(claim.completion_ids) != self.task.max_new_tokens:
            # Tasks have no stop token: an honest completion always runs to max_new_tokens.
            item.reject(
                GroupReason.COMPLETION_LENGTH,
                f"{len(claim.completion_ids)} completion tokens, the task generates {self.task.max_new_tokens}",
            )
        else:
            item.claim = claim

    def _score(self, item: _Item, prompt: list[int]) -> None:
        assert item.claim is not None
        try:
            reward = float(self.task.reward(prompt, list(item.claim.completion_ids)))
        except Exception as exc:  # the task is ours, but a verified completion must never crash the validator
            item.reject(GroupReason.REWARD_ERROR, f"{type(exc).__name__}: {exc}")
            return
        if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            item.reject(GroupReason.REWARD_ERROR, f"the task scored {reward!r}, outside [0, 1]")
            return
        item.reward = reward

    def _seal(
        self, worker: bytes, version: int, counter: int, items: list[_Item], accepted: bool
    ) -> list[bytes]:
        now = self._clock()
        with self._lock:
            first_seq = self._seq
            self._seq += len(items)
        return [
            seal(
                self._key,
                domain=VERDICT_DOMAIN,
                run_id=self.run_id,
                payload=rollouts_pb2.RolloutVerdict(
                    worker=worker,
                    rollout_hash=item.hash,
                    policy_version=version,
                    counter=counter,
                    index=item.index,
                    tokens=item.tokens,
                    accepted=accepted,
                    reason="" if accepted else str(item.reason),
                    detail=("accepted" if accepted else item.detail)[:MAX_DETAIL_CHARS],
                    reward=item.reward if accepted else 0.0,
                    issued_at=now,
                ).SerializeToString(),
                expires_at=now + self.receipt_ttl_s,
                seq=first_seq + i,
            )
            for i, item in enumerate(items)
        ]

    # --- accounting ---

    def stats(self) -> ValidatorStats:
        """Per worker: accepted, rejected by reason, abandoned assignments, ban; and the totals."""
        with self._lock:
            workers = self._accounts.workers()
            strikes = {w: self.bans.strikes(w) for w in workers}
            banned = {w for w in workers if self.bans.is_banned(w)}
            return self._accounts.snapshot(strikes, banned)
