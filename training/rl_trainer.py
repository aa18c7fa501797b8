"""The RL trainer role: GRPO on verified rollouts only, each new policy published through the broadcast.

`RLTrainer(node, config, judge, policy)` hosts on a started node:
- a `WeightBroadcast` that publishes every policy version (version 0 is the initial policy), so
  workers and validators follow it and re-serve its chunks;
- a `RolloutIntake` through which workers submit groups; groups that arrive together go to the
  `judge` in one batch (the validator, injected: `training` does not import `verification`;
  `node.rollouts.batcher`), whose sealed verdicts are the
  workers' answer and whose accepted rollouts, with the rewards it recomputed, are the only
  thing the trainer ever learns from;
- a training thread: once `groups_per_step` complete groups are buffered it runs one GRPO step,
  publishes the new version and moves the judge's staleness reference forward. A buffered
  rollout whose version fell more than `async_level` behind is dropped, never trained on.

With `checkpoint_dir`, every version is saved before it is published (`training.rl_checkpoint`:
with the optimizer's state and what its `PolicyUpdates` needs besides the weights, e.g. DiLoCo's
outer momentum); a restarted trainer resumes from its newest checkpoint, as if it had not
stopped, and republishes that version.

How GRPO steps become policy versions is a `PolicyUpdates` (default: every optimizer step is a
version). `updates=` injects another, e.g. `training.rl_diloco`'s, where several trainers
average every H steps and the versions are their common outer steps.
"""

from __future__ import annotations

import copy
import logging
import queue
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from hivemind.p2p import PeerID

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.broadcast.errors import StoreError
from node.node import HivenetNode
from node.rollouts.batcher import CallBatcher
from node.rollouts.config import ForwardConfig
from node.rollouts.errors import GroupRefused
from node.rollouts.forward import ForwardIntake
from node.rollouts.intake import RolloutIntake
from node.rollouts.tickets import TicketIntake
from node.runtime import offload
from protocol.envelope import Envelope
from protocol.manifest import Manifest
from protocol.node_record import Role
from protocol.rollout_messages import Forwarded, parse_rollout
from protocol.rollouts_pb2 import RolloutGroup, Ticket
from training.causal_lm import CausalLM
from training.grpo import ScoredRollout
from training.policy_updates import UpdatesFactory, every_step_updates
from training.rl_checkpoint import checkpoint_updates, resume_updates
from training.rl_run import JUDGE_LINGER_S, JUDGE_MAX_BATCH, RLRunConfig, RoleThread, group_id

__all__ = ["RLStepReport", "RLTrainer", "RolloutJudge"]

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 120.0
IDLE_REPORT_S = 30.0
"""A trainer that received no group for this long says why (no worker live, or none verified)."""


class RolloutJudge(Protocol):
    """What the trainer needs from a validator (`verification.validator.Validator` adapted to it)."""

    def judge_groups(
        self, submissions: list[tuple[bytes, RolloutGroup]]
    ) -> list[tuple[list[bytes], list[ScoredRollout]]]:
        """Per `(worker, group)`, in order: sealed verdicts for the group's rollouts and the accepted
        ones with recomputed rewards (as if judged one after another)."""
        ...

    def issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        """`worker`'s open tickets, topped up to `count` with tickets of `version` (raises TicketsRefused
        to issue none)."""
        ...

    def add_version(self, version: int, model: CausalLM) -> None: ...

    def set_trainer_step(self, step: int) -> None: ...


@dataclass
class RLStepReport:
    """One GRPO step of the trainer."""

    step: int
    version: int
    """The policy version this step produced (and published)."""
    mean_reward: float
    groups: int
    rollouts: int
    mean_staleness: float
    """Mean of (trainer version at the step - the rollout's policy version)."""
    stale_dropped: int
    """Accepted rollouts dropped so far because they fell behind the async level before training."""
    loss: float
    published: bool

    def describe(self) -> str:
        return (
            f"step {self.step:>4} | v{self.version} | reward {self.mean_reward:.3f} | groups {self.groups} | "
            f"staleness {self.mean_staleness:.2f} | stale dropped {self.stale_dropped} | loss {self.loss:+.4f}"
        )


class RLTrainer(RoleThread):
    """A GRPO trainer with its rollout intake and weight broadcast, on a started node."""

    def __init__(
        self,
        node: HivenetNode,
        config: RLRunConfig,
        judge: RolloutJudge,
        policy: CausalLM,
        *,
        checkpoint_dir: Path | None = None,
        on_step: Callable[[RLStepReport], None] | None = None,
        updates: UpdatesFactory = every_step_updates,
    ) -> None:
        assert node.dht is not None, "start the node first"
        self.node = node
        self.config = config
        self.judge = judge
        self.on_step = on_step
        self.checkpoint_dir = checkpoint_dir
        self.updates, self.resumed_steps = resume_updates(checkpoint_dir, policy, config.grpo, updates)
        self.learner = self.updates.learner
        self.reports: list[RLStepReport] = []
        self.stale_dropped = 0
        self.trained_hashes: set[bytes] = set()
        self.trained_from: Counter[bytes] = Counter()
        """Rollouts trained on, per worker PeerID."""
        self.published_at: dict[int, float] = {}
        self.manifests: dict[int, Manifest] = {}
        """The manifest this trainer published for each version."""
        self._inbox: queue.Queue[list[ScoredRollout]] = queue.Queue()
        self.groups_delivered = 0
        """Accepted groups handed to the training loop (by this trainer's validator or a forward)."""
        self.groups_settled = 0
        """Of those, the ones the training loop has taken and acted on (stepped on, buffered or dropped)."""
        self._taken: dict[bytes, int] = {}
        """Policy version of every group id taken into the buffer while that version is usable."""
        self._taken_rollouts: dict[bytes, int] = {}
        """The same for the hash of every rollout of those groups."""
        self.idle_report_s = IDLE_REPORT_S
        self._last_group_at = self._idle_checked_at = time.monotonic()
        super().__init__()
        publishers = [node.identity.peer_id.to_base58(), *config.authorized_publishers]
        self.broadcast = node.add_service(
            WeightBroadcast(
                dht=node.dht,
                identity=node.identity,
                attestations=node.attestations,
                config=BroadcastConfig(
                    store_dir=node.config.weights_dir,
                    authorized_publishers=sorted(set(publishers)),
                    keep_versions=config.grpo.async_level + 2,
                ),
                on_receipts=node.receipt_sink,
                metrics=node.metrics,
            )
        )
        self.judging: CallBatcher[tuple[bytes, RolloutGroup], tuple[list[bytes], list[ScoredRollout]]] = (
            CallBatcher(judge.judge_groups, linger_s=JUDGE_LINGER_S, max_batch=JUDGE_MAX_BATCH)
        )
        """Groups that arrive together are judged in one batch."""
        self.tickets = node.add_service(
            TicketIntake(
                dht=node.dht, identity=node.identity, run_id=config.run_id, handler=self._issue_tickets
            )
        )
        self.intake = node.add_service(
            RolloutIntake(
                dht=node.dht, identity=node.identity, run_id=config.run_id, handler=self._handle_group
            )
        )
        self.forwards = (
            node.add_service(
                ForwardIntake(
                    dht=node.dht,
                    identity=node.identity,
                    run_id=config.run_id,
                    handler=self._handle_forward,
                    config=ForwardConfig(trusted_validators=list(config.trusted_validators)),
                    on_receipts=node.receipt_sink,  # a copy of each validation receipt it signs
                )
            )
            if config.trusted_validators
            else None
        )

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> RLTrainer:
        self._new_version(self.version, steps=self.resumed_steps)
        self._start_thread(f"rl-trainer-{self.node.short_id}")
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        super().stop(timeout_s)
        self.updates.close()

    @property
    def version(self) -> int:
        return self.updates.version

    # ---- intake --------------------------------------------------------------------------

    async def _issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        return await offload(self.judge.issue_tickets, worker, count, version)

    async def _handle_group(self, worker: bytes, envelope: Envelope, group: RolloutGroup) -> list[bytes]:
        verdicts, accepted = await self.judging.submit((worker, group))
        if accepted:
            self._deliver(accepted)
        return verdicts

    async def _handle_forward(self, validator: bytes, forwarded: Forwarded) -> None:
        """A group a trusted validator accepted (every signature already checked by the transport)."""
        group = forwarded.group
        if not all(v.accepted for v in forwarded.verdicts):
            raise GroupRefused("only wholly accepted groups are trained on")
        worker = forwarded.group_envelope.signer
        rollouts = []
        for raw, verdict in zip(group.rollouts, forwarded.verdicts, strict=True):
            rollout = parse_rollout(raw)
            rollouts.append(
                ScoredRollout(
                    prompt_ids=list(rollout.prompt_ids),
                    completion_ids=list(rollout.completion_ids),
                    reward=verdict.reward,
                    policy_version=group.policy_version,
                    group_id=group_id(worker, group.counter, validator),
                    rollout_hash=verdict.rollout_hash,
                    worker=worker,
                )
            )
        self._deliver(rollouts)

    def _deliver(self, group: list[ScoredRollout]) -> None:
        self.groups_delivered += 1
        self._inbox.put(group)

    @property
    def settled(self) -> bool:
        """Whether the training loop has acted on every group delivered so far (or has ended): until
        more groups arrive, it will take no further step."""
        return self.groups_settled >= self.groups_delivered or not self.alive

    # ---- training ------------------------------------------------------------------------

    def _new_version(self, version: int, *, steps: int) -> None:
        """Let the judge verify against `version` (made by the run's first `steps` GRPO steps),
        checkpoint it, publish it.

        The checkpoint comes first: a trainer that dies between the two resumes at a version the
        network may not have seen yet (it publishes it then), never at an older one, whose next
        step would publish a version number the network already holds with other weights.
        """
        snapshot = copy.deepcopy(self.learner.model).eval()
        self.judge.add_version(version, snapshot)
        self.judge.set_trainer_step(version)
        state = self.learner.state_dict()
        if self.checkpoint_dir is not None:
            checkpoint_updates(self.checkpoint_dir, self.updates, state, steps=steps)
        try:
            manifest = self.node.call(self._publish(version, state), timeout_s=PUBLISH_TIMEOUT_S)
            self.published_at[version] = time.time()
            self.manifests[version] = manifest
            logger.info(
                "[%s] published version %d (%d bytes)", self.node.short_id, version, manifest.total_bytes
            )
        except Exception as exc:
            logger.warning("[%s] could not publish version %d: %r", self.node.short_id, version, exc)

    async def _publish(self, version: int, state: dict[str, torch.Tensor]) -> Manifest:
        """Publish `version`, or announce it again if the store holds it already (a restarted trainer).

        A copy of `version` published by another of the run's trainers (fetched into this store,
        e.g. when this node followed the run before) is replaced by this trainer's own
        publication: the copy's pointer and manifest are the other's, so peers that trust only
        this trainer would never find it. Holding the same weights, the two publications have
        the same content id and chunks, and each holder serves the fetchers of both.
        """
        run_id = self.config.run_id
        held = self.broadcast.store.get(run_id, version)
        if held is not None and held.manifest.publisher != self.node.identity.peer_id_bytes:
            logger.info(
                "[%s] version %d in the store was published by %s; publishing it as this trainer's own",
                self.node.short_id, version, PeerID(held.manifest.publisher).to_base58()[-8:],
            )  # fmt: skip
            self.broadcast.service.withdraw(run_id, version)
            await offload(self.broadcast.store.remove, run_id, version)
            held = None
        if held is None:
            return await self.broadcast.publish(run_id, version, state)
        stored = await offload(held.load_state_dict)
        if stored.keys() != state.keys() or not all(torch.equal(stored[k], state[k]) for k in state):
            raise StoreError(
                f"version {version} is already in the store with other weights (published before a crash "
                "that lost its checkpoint): it cannot be published again"
            )
        await self.broadcast.records.announce_holder(held)
        await self.broadcast.records.announce_pointer(held.manifest)
        return held.manifest

    def _run(self) -> None:
        groups: dict[bytes, list[ScoredRollout]] = {}
        step = self.resumed_steps
        while not self._stop.is_set():
            if self.config.max_trainer_steps is not None and step >= self.config.max_trainer_steps:
                return
            try:
                arrived = self._inbox.get(timeout=0.5)  # one whole group
            except queue.Empty:
                arrived = []
            step = self._take(arrived, groups, step)
            if arrived:
                self.groups_settled += 1
            self._note_idleness(bool(arrived))

    def _note_idleness(self, arrived: bool) -> None:
        """Once no group arrived for `idle_report_s`, say why (every `idle_report_s`, a line when it changes)."""
        now = time.monotonic()
        if arrived:
            self._last_group_at = now
            self._waiting(None)
        elif (
            now - self._last_group_at >= self.idle_report_s
            and now - self._idle_checked_at >= self.idle_report_s
        ):
            self._idle_checked_at = now
            self._waiting(self._idle_reason())

    def _idle_reason(self) -> str:
        idle = f"{self.idle_report_s:g} s"
        try:
            workers = len(self.node.discover(Role.INFERENCE))
        except Exception:  # a failed lookup says nothing about the workers
            return f"no verified group has reached this trainer for {idle}"
        if workers == 0:
            return (
                f"no inference worker of run {self.config.run_id!r} is live: workers join with `hivenet join --rl "
                f"--role inference --publisher {self.node.identity.peer_id.to_base58()} ...`"
            )
        return (
            f"{workers} inference worker(s) live, but no verified group has reached this trainer for {idle} "
            "(the workers' lines say why)"
        )

    def _take(self, arrived: list[ScoredRollout], groups: dict[bytes, list[ScoredRollout]], step: int) -> int:
        """Buffer the group that `arrived` (if any), drop what fell out of use, and step on a full
        batch; returns the next step's number."""
        grpo = self.config.grpo
        # a group judged twice (by one validator, or its rollouts by two) is trained on once
        if (
            arrived
            and arrived[0].group_id not in self._taken
            and not self._taken_rollouts.keys() & {r.rollout_hash for r in arrived}
        ):
            self._taken[arrived[0].group_id] = arrived[0].policy_version
            self._taken_rollouts.update(
                dict.fromkeys((r.rollout_hash for r in arrived), arrived[0].policy_version)
            )
            groups[arrived[0].group_id] = list(arrived)
        oldest_usable = self.version - grpo.async_level
        for taken in (self._taken, self._taken_rollouts):
            for key in [k for k, v in taken.items() if v < oldest_usable]:
                del taken[key]  # a group of an unusable version is refused as stale anyway
        # the learner holds the weights of the versions it made since it started (a restarted
        # trainer: none before its checkpoint's), and it can learn from rollouts of those only
        known = set(self.learner.known_versions)
        for stale in [
            g
            for g, rs in groups.items()
            if rs[0].policy_version < oldest_usable or rs[0].policy_version not in known
        ]:
            self.stale_dropped += len(groups.pop(stale))
        complete = [g for g, rs in groups.items() if len(rs) == grpo.group_size]
        if len(complete) < grpo.groups_per_step:
            return step
        batch = [groups.pop(g) for g in complete[: grpo.groups_per_step]]
        report = self._step(step, batch)
        self.reports.append(report)
        self.node.metrics.rl_step_done(
            version=report.version,
            mean_reward=report.mean_reward,
            mean_staleness=report.mean_staleness,
            tokens_trained=sum(len(r.completion_ids) for group in batch for r in group),
            loss=report.loss,
        )
        if self.on_step is not None:
            try:
                self.on_step(report)
            except Exception:  # a failing progress line must never stop training
                logger.exception("reporting step %d failed; the trainer goes on", report.step)
        return step + 1

    def _step(self, step: int, batch: list[list[ScoredRollout]]) -> RLStepReport:
        version_before = self.version
        rewards = [r.reward for group in batch for r in group]
        staleness = [version_before - r.policy_version for group in batch for r in group]
        result, new_version = self.updates.step(batch, stop_event=self._stop)
        for group in batch:
            self.trained_hashes.update(r.rollout_hash for r in group)
            self.trained_from.update(r.worker for r in group)
        if new_version:
            self._new_version(self.version, steps=step + 1)
        return RLStepReport(
            step=step,
            version=self.version,
            mean_reward=statistics.fmean(rewards),
            groups=len(batch),
            rollouts=len(rewards),
            mean_staleness=statistics.fmean(staleness),
            stale_dropped=self.stale_dropped,
            loss=float(result.loss),
            published=self.version in self.published_at,
        )
