"""The validator of a decentralized RL run: judges workers' rollout groups and signs a receipt per rollout.

A worker first asks for tickets (`issue_tickets`): each fixes an assignment's counter, its policy
version (the newest this validator holds) and a random nonce (`verification.tickets`).

`Validator.judge_group(worker, group)` takes a `RolloutGroup` whose envelope the transport has
already verified as signed by `worker` (`judge_groups` takes several and verifies them in one
batch). First the group-level checks, cheap and in this order (every rollout of the group then
gets the same reason): the worker is banned (`banned`); the group names no open ticket of this
worker: one this validator never issued (`no_ticket`), or one judged or abandoned already
(`replay`, or `stale` when its version is too old anyway); the group's version is not its
ticket's (`wrong_version`: it bans); the version is not held yet (`unknown_version`: after a
restart; nothing is used up, the worker may resubmit); the task is not the run's
(`wrong_task`); the group does not hold `group_size` rollouts (`group_size`); the version is more
than `async_level` behind the trainer or already dropped (`stale`); a rollout was accepted
before (`replay`). Then the per-rollout checks of `verification.rollout_checks` (assignment from
the ticket, TOPLOC and sampling verdict, recomputed reward); a group is accepted whole or not at
all, and closes its ticket either way.

Rejections that prove tampering (`BANNING_REASONS`) ban the worker, for longer each time, and
the verdict of the rollout that proved it carries the ban's end (`banned_until`), so a ban is on
record in every ledger that holds the verdict; the others are only counted. Tickets that expire
unused count as abandoned, and a worker that abandons more than `abandon_allowance` permits is
banned too (dropping the assignments that came out badly pays only while it goes unnoticed).
Each verdict is sealed as a receipt signed by the validator
(`protocol.rollout_messages.seal_verdict`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.bans import BanList
from node.rollouts.errors import TicketsRefused
from protocol import rollouts_pb2
from protocol.assignment import derive_assignment
from protocol.peer_keys import Signer
from protocol.verification_policy import RunVerification
from training.causal_lm import CausalLM
from training.sampling import SamplingParams
from verification.replay_memory import ReplayMemory
from verification.rollout_checks import (
    BANNING_REASONS,
    UNJUDGED_REASONS,
    GroupJob,
    GroupReason,
    RewardTask,
    RolloutItem,
    check_groups,
    parse_item,
)
from verification.tickets import Ticket, TicketBook
from verification.verdict import RolloutVerifier
from verification.verdict_sealing import seal_abandoned_verdicts, seal_group_verdicts
from verification.verifier_window import VerifierWindow, VersionStatus, VersionVerdict
from verification.worker_accounts import ValidatorStats, WorkerAccounts, WorkerStats

__all__ = [
    "BANNING_REASONS",
    "GroupReason",
    "RewardTask",
    "Validator",
    "ValidatorStats",
    "VerifiedRollout",
    "WorkerStats",
    "abandon_allowance",
]


def abandon_allowance(judged: int) -> int:
    """Tickets a worker with `judged` groups judged may abandon before it is banned: a few (a validator
    that went away, a worker that crashed before generating) and one in 32 beyond."""
    return 2 + judged // 32


@dataclass
class VerifiedRollout:
    """An accepted rollout, with the reward the validator recomputed: what the trainer learns from."""

    worker: bytes
    validator: bytes
    """The validator that judged it (whose ticket `counter` is)."""
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
        verification: RunVerification | None = None,
        bans: BanList | None = None,
        clock: Callable[[], float] = time.time,
        sampling: SamplingParams | None = None,
        tickets: TicketBook | None = None,
        replays: ReplayMemory | None = None,
        on_verdicts: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        """`tickets`: the book of issued tickets (None: one in memory; a node keeps it in a file, so a
        restart forgets no ticket). `replays`: where accepted rollouts' hashes are kept (None: in memory
        only; a node keeps them in a file, so a rollout accepted before a restart is a replay after
        it). `on_verdicts` is handed every batch of sealed verdicts (the
        validator's own receipts, e.g. for its node's ledger, `node.node.HivenetNode.receipt_sink`);
        it must not block."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.run_id = run_id
        self.task = task
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.bans = bans or BanList(base_s=60.0, max_s=24 * 3600.0, owner="validator")
        self._signer = Signer(private_key)  # a verdict per rollout: derive the signing key once
        self._clock = clock
        self._window = VerifierWindow(async_level, verification, replays)
        self._accounts = WorkerAccounts()
        self.tickets = tickets if tickets is not None else TicketBook(run_id=run_id)
        self._judging_counters: set[tuple[bytes, int]] = set()
        self._judging_hashes: set[bytes] = set()
        self._lock = threading.Lock()
        self._seq = int(clock() * 1e6)
        self.on_verdicts = on_verdicts

    # --- policy versions ---

    def add_version(self, version: int, model: CausalLM) -> None:
        """Hold `version` (a private copy of `model`), dropping versions beyond the newest async_level + 1."""
        with self._lock:
            self._window.add(version, model)
            self._expire_tickets()

    def set_trainer_step(self, step: int) -> None:
        """The trainer's current step: groups of versions older than `step - async_level` are stale."""
        with self._lock:
            self._window.trainer_step = step
            self._expire_tickets()

    # --- tickets ---

    def issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        """`worker`'s open tickets here if it holds any, else `count` new tickets of policy `version`.

        The worker names the version (the newest it holds) before it learns the tickets' nonces, so
        before any outcome. It gets no new ticket while it holds one: every ticket is submitted (or
        abandoned, which takes its version going stale and then `grace_s`) before the next ones,
        so a worker cannot drop the tickets that came out badly and carry on. Raises
        TicketsRefused (its reason for the worker) when the worker is banned, when `version` is not
        held here or is too old to judge, or when every ticket this validator keeps open is taken.
        """
        with self._lock:
            self._expire_tickets()
            if self.bans.is_banned(worker):
                raise TicketsRefused("this worker is banned here for a while")
            held = self.tickets.open_tickets(worker)
            if held:
                return held
            standing = self._window.classify(version)
            if standing.status is not VersionStatus.HELD:
                raise TicketsRefused(f"no tickets: {standing.detail}")
            tickets = self.tickets.issue(worker, count, version, self._clock())
        if not tickets:
            raise TicketsRefused(
                "busy: this validator has issued all the tickets it keeps open; ask again later"
            )
        return tickets

    def _expire_tickets(self) -> None:
        """Abandon tickets whose version has been too old to judge for a while, and ban the workers
        that abandoned more than they may (lock held)."""

        def usable(version: int) -> bool:
            return self._window.classify(version).status is not VersionStatus.STALE

        abandoned = self.tickets.expire(usable, self._clock())
        verdicts: list[bytes] = []
        for worker in dict.fromkeys(t.worker for t in abandoned):
            tickets = [t for t in abandoned if t.worker == worker]
            counts = self.tickets.counts_of(worker)
            ban_s = 0.0
            if counts.abandoned > abandon_allowance(counts.judged):
                ban_s = self.bans.ban(
                    worker,
                    f"abandoned {counts.abandoned} tickets (this time {len(tickets)}), {counts.judged} judged",
                )
                self._accounts.record_ban(worker, self._clock() + ban_s)
            verdicts += self._seal_abandoned(tickets, ban_s)
        if verdicts and self.on_verdicts is not None:
            self.on_verdicts(verdicts)

    def _seal_abandoned(self, tickets: list[Ticket], ban_s: float) -> list[bytes]:
        """The `abandoned` verdicts of one worker's expired tickets (lock held)."""
        first_seq = self._seq
        self._seq += len(tickets)
        return seal_abandoned_verdicts(
            self._signer,
            run_id=self.run_id,
            tickets=tickets,
            ban_s=ban_s,
            now=self._clock(),
            first_seq=first_seq,
        )

    @property
    def held_versions(self) -> list[int]:
        with self._lock:
            return self._window.held

    # --- judging ---

    def judge_group(
        self, worker: bytes, group: rollouts_pb2.RolloutGroup
    ) -> tuple[list[bytes], list[VerifiedRollout]]:
        """Sealed verdicts (one per rollout, at most `group_size`) and the accepted rollouts (all or none)."""
        return self.judge_groups([(worker, group)])[0]

    def judge_groups(
        self, submissions: Sequence[tuple[bytes, rollouts_pb2.RolloutGroup]]
    ) -> list[tuple[list[bytes], list[VerifiedRollout]]]:
        """`judge_group` on each `(worker, group)`, as if one after another, verifying them in one batch.

        The verdicts are those of judging the groups in order. A group that holds a rollout of an
        earlier group in the list, or the same assignment counter, is judged after that one's
        verdict (in a later batch), so nothing is accepted twice; a group whose worker an earlier
        group got banned is refused as `banned`.
        """
        parsed = [
            # every rollout (the protocol caps how many) gets a verdict, one of a wrong-size group too
            [parse_item(i, data) for i, data in enumerate(group.rollouts)]
            for _, group in submissions
        ]
        results: list[tuple[list[bytes], list[VerifiedRollout]] | None] = [None] * len(submissions)
        waiting = list(range(len(submissions)))
        while waiting:
            batch: list[int] = []
            later: list[int] = []
            hashes: set[bytes] = set()
            counters: set[tuple[bytes, int]] = set()
            for s in waiting:
                worker, group = submissions[s]
                own = {item.hash for item in parsed[s]}
                counter = (worker, int(group.counter))
                (later if own & hashes or counter in counters else batch).append(s)
                hashes |= own
                counters.add(counter)
            judged = self._judge_batch([(*submissions[s], parsed[s]) for s in batch])
            for s, result in zip(batch, judged, strict=True):
                results[s] = result
            waiting = later
        return [result for result in results if result is not None]

    def _judge_batch(
        self, batch: list[tuple[bytes, rollouts_pb2.RolloutGroup, list[RolloutItem]]]
    ) -> list[tuple[list[bytes], list[VerifiedRollout]]]:
        """Judge groups that share no rollout and no counter: the group-level checks, one verification of
        every group they let through, then each group's conclusion in order.

        Until a group is concluded its counter (if judging uses it) and its rollout hashes (if it is
        verified) are reserved: the same counter or rollout submitted meanwhile (judged on another
        thread) is a replay.
        """
        with self._lock:
            self._expire_tickets()
            refusals = [self._refusal(worker, group, items) for worker, group, items in batch]
            reserved = [
                self._reserve(worker, group, items if refusal is None else [])
                for (worker, group, items), (refusal, _, _) in zip(batch, refusals, strict=True)
                if refusal is None or refusal[0] not in UNJUDGED_REASONS
            ]
        try:
            jobs = []
            for (worker, _, items), (refusal, verifier, ticket) in zip(batch, refusals, strict=True):
                if refusal is None:
                    assert verifier is not None and ticket is not None
                    assignment = derive_assignment(
                        self.run_id,
                        ticket.policy_version,
                        worker,
                        ticket.counter,
                        self.group_size,
                        nonce=ticket.nonce,
                    )
                    jobs.append(GroupJob(items, assignment, verifier))
            check_groups(jobs, task=self.task, sampling=self.sampling)
            results = []
            for (worker, group, items), (refusal, _, ticket) in zip(batch, refusals, strict=True):
                with self._lock:
                    if refusal is None and self.bans.is_banned(worker):  # by a group before it in this batch
                        refusal = (GroupReason.BANNED, "this worker is banned")
                    if refusal is not None:
                        for item in items:
                            item.reject(*refusal)
                    if ticket is not None and (refusal is None or refusal[0] not in UNJUDGED_REASONS):
                        self.tickets.judged(worker, ticket.counter)
                accepted = refusal is None and not any(item.reason for item in items)
                results.append(self._conclude(worker, group, items, accepted=accepted))
            return results
        finally:  # after the conclusions: an accepted rollout is remembered before it is released
            with self._lock:
                for counter, hashes in reserved:
                    self._judging_counters.discard(counter)
                    self._judging_hashes.difference_update(hashes)

    def _reserve(
        self, worker: bytes, group: rollouts_pb2.RolloutGroup, items: list[RolloutItem]
    ) -> tuple[tuple[bytes, int], set[bytes]]:
        """Mark a group's counter and the rollouts `items` as being judged (lock held)."""
        counter = (worker, int(group.counter))
        hashes = {item.hash for item in items}
        self._judging_counters.add(counter)
        self._judging_hashes.update(hashes)
        return counter, hashes

    def _conclude(
        self, worker: bytes, group: rollouts_pb2.RolloutGroup, items: list[RolloutItem], *, accepted: bool
    ) -> tuple[list[bytes], list[VerifiedRollout]]:
        """Record a judged group (hashes, ban, accounts), seal its verdicts and list what was accepted."""
        version, counter = int(group.policy_version), int(group.counter)
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
                validator=self._signer.peer_id,
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
    ) -> tuple[tuple[str, str] | None, RolloutVerifier | None, Ticket | None]:
        """The group-level rejection, if any, else the verifier of the group's version and its open
        ticket (lock held)."""
        version, counter = int(group.policy_version), int(group.counter)
        if self.bans.is_banned(worker):
            return (GroupReason.BANNED, "this worker is banned"), None, None
        if (worker, counter) in self._judging_counters:
            return (GroupReason.REPLAY, f"ticket {counter} is being judged"), None, None
        ticket = self.tickets.ticket(worker, counter)
        standing = self._window.classify(version)
        if ticket is None:
            if not self.tickets.was_issued(worker, counter):
                return (
                    (
                        GroupReason.NO_TICKET,
                        f"this validator issued no ticket {counter} to this worker; ask it for tickets first",
                    ),
                    None,
                    None,
                )
            if standing.status is VersionStatus.STALE:
                return (GroupReason.STALE, f"{standing.detail}; its ticket expired"), None, None
            return (GroupReason.REPLAY, f"ticket {counter} was judged or abandoned already"), None, None
        if version != ticket.policy_version:
            return (
                (
                    GroupReason.WRONG_VERSION,
                    f"ticket {counter} fixes policy version {ticket.policy_version}, the group names {version}",
                ),
                None,
                None,
            )
        refusal, verifier = self._version_refusal(group, items, standing)
        return refusal, verifier, ticket

    def _version_refusal(
        self,
        group: rollouts_pb2.RolloutGroup,
        items: list[RolloutItem],
        standing: VersionVerdict,
    ) -> tuple[tuple[str, str] | None, RolloutVerifier | None]:
        """The checks after the ticket's: version held, task, size, staleness, replayed rollouts."""
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
            if (
                self._window.seen_hash(item.hash)
                or item.hash in self._judging_hashes
                or hashes.count(item.hash) > 1
            ):
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
        """One signed verdict per rollout (`verification.verdict_sealing`)."""
        with self._lock:
            first_seq = self._seq
            self._seq += len(items)
        return seal_group_verdicts(
            self._signer,
            run_id=self.run_id,
            worker=worker,
            version=version,
            counter=counter,
            items=items,
            accepted=accepted,
            ban=ban,
            now=self._clock(),
            first_seq=first_seq,
        )

    # --- accounting ---

    def stats(self) -> ValidatorStats:
        """Per worker: accepted, rejected by reason, abandoned assignments, ban; and the totals."""
        with self._lock:
            workers = self._accounts.workers()
            tickets = self.tickets.counts()
            everyone = set(workers) | tickets.keys()
            strikes = {w: self.bans.strikes(w) for w in everyone}
            banned = {w for w in everyone if self.bans.is_banned(w)}
            return self._accounts.snapshot(strikes, banned, tickets)
