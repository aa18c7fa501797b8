"""The validator of a decentralized RL run: judges workers' rollout groups and signs a receipt per rollout.

`Validator.judge_group(worker, group)` takes a `RolloutGroup` whose envelope the transport has
already verified as signed by `worker`. First the group-level checks, cheap and in this order
(every rollout of the group then gets the same reason): the worker is banned (`banned`); its
assignment counter was judged already, or written off long ago as abandoned (`replay`); the
policy version is not held and never was (`unknown_version`: nothing is used up, the worker
may resubmit once this validator holds it); the task is not the run's (`wrong_task`); the
group does not hold `group_size` rollouts (`group_size`); the version is more than
`async_level` behind the trainer or already dropped (`stale`); a rollout was accepted before
(`replay`). Then the per-rollout checks of `verification.rollout_checks` (assignment, TOPLOC
and sampling verdict, recomputed reward); a group is accepted whole or not at all.

Rejections that prove tampering (`BANNING_REASONS`) ban the worker, for longer each time, and
the verdict of the rollout that proved it carries the ban's end (`banned_until`), so a ban is on
record in every ledger that holds the verdict; the others are only counted. Every judged group uses its assignment counter; skipped counters
are counted as abandoned assignments (`verification.worker_accounts`). Each verdict is sealed
as a receipt signed by the validator (`protocol.rollout_messages.seal_verdict`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.bans import BanList
from protocol import rollouts_pb2
from protocol.assignment import derive_assignment
from protocol.limits import MAX_VERDICT_BAN_S
from protocol.peer_keys import Signer
from protocol.rollout_messages import seal_verdict
from training.model import TinyGPT
from training.sampling import SamplingParams
from verification.policy import DEFAULT_POLICY, VerificationPolicy
from verification.rollout_checks import (
    BANNING_REASONS,
    UNJUDGED_REASONS,
    GroupReason,
    RewardTask,
    RolloutItem,
    check_rollouts,
    parse_item,
)
from verification.verdict import RolloutVerifier
from verification.verifier_window import VerifierWindow, VersionStatus
from verification.worker_accounts import DEFAULT_LATE_WINDOW, ValidatorStats, WorkerAccounts, WorkerStats

__all__ = [
    "BANNING_REASONS",
    "GroupReason",
    "RewardTask",
    "Validator",
    "ValidatorStats",
    "VerifiedRollout",
    "WorkerStats",
]


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
        late_window: int = DEFAULT_LATE_WINDOW,
        on_verdicts: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        """`on_verdicts` is handed every batch of sealed verdicts (the validator's own receipts, e.g. for
        its node's ledger, `node.node.HivenetNode.receipt_sink`); it must not block."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.run_id = run_id
        self.task = task
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.bans = bans or BanList(base_s=60.0, max_s=24 * 3600.0, owner="validator")
        self._signer = Signer(private_key)  # a verdict per rollout: derive the signing key once
        self._clock = clock
        self._window = VerifierWindow(async_level, policy)
        self._accounts = WorkerAccounts(late_window)
        self._lock = threading.Lock()
        self._seq = int(clock() * 1e6)
        self.on_verdicts = on_verdicts

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
        items = [parse_item(i, data) for i, data in enumerate(group.rollouts[: self.group_size])]
        with self._lock:
            refusal, verifier = self._refusal(worker, group, items)
            if refusal is None or refusal[0] not in UNJUDGED_REASONS:
                self._accounts.use_counter(worker, counter)
        if refusal is not None:
            for item in items:
                item.reject(*refusal)
        else:
            assert verifier is not None
            assignment = derive_assignment(self.run_id, version, worker, counter, self.group_size)
            check_rollouts(
                items, task=self.task, sampling=self.sampling, assignment=assignment, verifier=verifier
            )
        accepted = refusal is None and all(not item.reason for item in items)
        with self._lock:
            if accepted:
                # Only accepted rollouts: remembering rejected ones would let whoever saw a worker's
                # rollouts burn them by submitting them first under another identity.
                self._window.remember_hashes(version, [item.hash for item in items])
            failure = next((item for item in items if item.reason in BANNING_REASONS), None)
            ban: tuple[int, float] | None = None
            if failure is not None:
                duration = self.bans.ban(worker, f"{failure.reason}: {failure.detail}")
                self._accounts.record_ban(worker, self._clock() + duration)
                ban = (failure.index, duration)
            for item in items:
                self._accounts.record(worker, accepted, item.reason, item.tokens)
        verdicts = self._seal(worker, version, counter, items, accepted, ban)
        if self.on_verdicts is not None:
            self.on_verdicts(verdicts)
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
        self, worker: bytes, group: rollouts_pb2.RolloutGroup, items: list[RolloutItem]
    ) -> tuple[tuple[str, str] | None, RolloutVerifier | None]:
        """The group-level rejection, if any, else the verifier of the group's version (lock held)."""
        version, counter = int(group.policy_version), int(group.counter)
        if self.bans.is_banned(worker):
            return (GroupReason.BANNED, "this worker is banned"), None
        status = self._accounts.counter_status(worker, counter)
        if status == "used":
            return (GroupReason.REPLAY, f"assignment counter {counter} was already judged"), None
        if status == "settled":
            return (
                GroupReason.REPLAY,
                f"assignment counter {counter} is settled (judged, or written off as abandoned)",
            ), None
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

    def _seal(
        self,
        worker: bytes,
        version: int,
        counter: int,
        items: list[RolloutItem],
        accepted: bool,
        ban: tuple[int, float] | None,
    ) -> list[bytes]:
        """One signed verdict per rollout; the rollout that got the worker banned (`ban`: its index
        and the ban's length) says so in its verdict, so the ban is on record in the ledger."""
        now = self._clock()
        ban_index, ban_s = ban if ban is not None else (-1, 0.0)
        with self._lock:
            first_seq = self._seq
            self._seq += len(items)
        return [
            seal_verdict(
                self._signer,
                run_id=self.run_id,
                verdict=rollouts_pb2.RolloutVerdict(
                    worker=worker,
                    rollout_hash=item.hash,
                    policy_version=version,
                    counter=counter,
                    index=item.index,
                    tokens=item.tokens,
                    accepted=accepted,
                    reason="" if accepted else str(item.reason),
                    detail="accepted" if accepted else item.detail,
                    reward=item.reward if accepted else 0.0,
                    issued_at=now,
                    banned_until=now + min(ban_s, MAX_VERDICT_BAN_S)
                    if item.index == ban_index and ban_s > 0
                    else 0.0,
                ),
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
