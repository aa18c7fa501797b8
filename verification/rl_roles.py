"""The validator on the network: inside a trainer process, or as a node of its own.

- `TrainerJudge` adapts a `Validator` to what `training.rl_trainer.RLTrainer` consumes (the
  trainer's own validator: verdicts go back to the worker, accepted rollouts straight to GRPO).
- `start_rl_trainer(node, config, policy)` builds that validator and the trainer on a node
  announced as trainer and validator; with `config.diloco` the trainer trains together with
  the run's other trainers (`training.rl_diloco`: a version per DiLoCo outer step, and a
  training receipt for each other trainer whose contribution a round accepted).
- `StandaloneValidator(node, config)`: `--role validator` on an RL run. It follows the run's
  policy versions through the weight broadcast (the newest `async_level + 1`; the newest
  published version is its staleness reference), issues tickets and judges the groups workers
  submit for them, and forwards each accepted group to one of the run's trainers (the next if
  that one fails, so that it is trained on once), which re-checks every signature, accepts
  forwards only from validators it trusts and answers one it took with a validation receipt (the
  validator's credit, kept in its ledger). A worker hears "accepted" once the group is queued
  durably (`node.rollouts.forward_queue`): a busy or restarting trainer loses nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from node.broadcast.store import VersionEntry
from node.log_limit import LogOncePer
from node.metrics import NodeMetrics
from node.node import HivenetNode
from node.rollouts.batcher import CallBatcher
from node.rollouts.errors import GroupRefused
from node.rollouts.forward import forward_group
from node.rollouts.forward_queue import ForwardQueue
from node.rollouts.intake import RolloutIntake
from node.rollouts.peers import connect_member
from node.rollouts.tickets import TicketIntake
from node.runtime import offload
from protocol import hivenet_pb2 as hpb
from protocol.envelope import Envelope
from protocol.node_record import Role
from protocol.rollouts_pb2 import RolloutGroup, RolloutVerdict, Ticket
from training.causal_lm import CausalLM
from training.devices import resolve_device
from training.grpo import ScoredRollout
from training.policy_updates import UpdatesFactory, every_step_updates
from training.rl_diloco import node_diloco_updates
from training.rl_run import (
    JUDGE_LINGER_S,
    JUDGE_MAX_BATCH,
    RLRunConfig,
    add_policy_follower,
    group_id,
    held_versions,
    model_from_state,
    run_task,
)
from training.rl_trainer import RLStepReport, RLTrainer
from verification.replay_memory import ReplayMemory
from verification.tickets import TicketBook
from verification.validator import Validator, VerifiedRollout

__all__ = ["StandaloneValidator", "TrainerJudge", "scored", "start_rl_trainer"]

logger = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 30.0
FORWARD_FAILURE_LOG_INTERVAL_S = 30.0
"""A trainer that cannot take forwards (restarting, its slots busy) is named once per this long."""


def scored(rollout: VerifiedRollout) -> ScoredRollout:
    """A verified rollout as the learner takes it (the reward is the validator's recomputation)."""
    return ScoredRollout(
        prompt_ids=list(rollout.prompt_ids),
        completion_ids=list(rollout.completion_ids),
        reward=rollout.reward,
        policy_version=rollout.policy_version,
        group_id=group_id(rollout.worker, rollout.counter, rollout.validator),
        rollout_hash=rollout.rollout_hash,
        worker=rollout.worker,
    )


def make_validator(node: HivenetNode, config: RLRunConfig) -> Validator:
    """The run's validator on `node`, its tickets and the hashes of the rollouts it accepted kept beside
    the node's weights (a restart keeps them: what was judged before it is a replay after it)."""
    return Validator(
        private_key=node.identity.private_key,
        run_id=config.run_id,
        task=run_task(config),
        group_size=config.grpo.group_size,
        async_level=config.grpo.async_level,
        sampling=config.grpo.sampling,
        verification=config.run_verification,
        tickets=TicketBook(
            node.config.weights_dir / f"{config.run_id}.tickets.db",
            run_id=config.run_id,
            grace_s=config.submit_timeout_s,
        ),
        replays=ReplayMemory(node.config.weights_dir / f"{config.run_id}.replays.db", run_id=config.run_id),
        on_verdicts=node.receipt_sink,  # the validator's own ledger keeps (and serves) its receipts
    )


def issue_tickets(validator: Validator, worker: bytes, count: int, version: int) -> list[Ticket]:
    """The validator's tickets for `worker`, as the ticket service sends them."""
    return [
        Ticket(counter=t.counter, policy_version=t.policy_version, nonce=t.nonce)
        for t in validator.issue_tickets(worker, count, version)
    ]


def count_verdicts(metrics: NodeMetrics, sealed_verdicts: list[bytes], seconds: float) -> None:
    """Count our own freshly sealed verdicts by outcome and reason (no signature check needed)."""
    per_rollout = seconds / len(sealed_verdicts) if sealed_verdicts else 0.0
    for sealed in sealed_verdicts:
        body = hpb.EnvelopeBody.FromString(hpb.SignedEnvelope.FromString(sealed).body)
        verdict = RolloutVerdict.FromString(body.payload)
        if verdict.accepted:
            metrics.rollout_judged("accepted", seconds=per_rollout)
        else:
            metrics.rollout_judged("rejected", verdict.reason, seconds=per_rollout)


class TrainerJudge:
    """A `Validator` seen through the trainer's `RolloutJudge` interface."""

    def __init__(self, validator: Validator, metrics: NodeMetrics | None = None) -> None:
        self.validator = validator
        self.metrics = metrics
        self.cpu_seconds = 0.0
        """CPU time spent judging (verdicts and rewards), on whichever thread judged."""
        self.rollouts_judged = 0
        self.accepted_hashes: set[bytes] = set()
        """Hashes of every rollout this validator accepted (what its trainer may learn from)."""

    def judge_groups(
        self, submissions: list[tuple[bytes, RolloutGroup]]
    ) -> list[tuple[list[bytes], list[ScoredRollout]]]:
        started = time.thread_time()
        judged = self.validator.judge_groups(submissions)
        spent = time.thread_time() - started
        self.cpu_seconds += spent
        results = []
        for verdicts, accepted in judged:
            self.rollouts_judged += len(verdicts)
            if self.metrics is not None:
                count_verdicts(self.metrics, verdicts, spent / len(judged))
            self.accepted_hashes.update(r.rollout_hash for r in accepted)
            results.append((verdicts, [scored(r) for r in accepted]))
        return results

    def issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        return issue_tickets(self.validator, worker, count, version)

    def add_version(self, version: int, model: CausalLM) -> None:
        self.validator.add_version(version, model)

    def set_trainer_step(self, step: int) -> None:
        self.validator.set_trainer_step(step)


def start_rl_trainer(
    node: HivenetNode,
    config: RLRunConfig,
    policy: CausalLM,
    *,
    checkpoint_dir: Path | None = None,
    on_step: Callable[[RLStepReport], None] | None = None,
) -> tuple[RLTrainer, Validator]:
    """A trainer with its own validator on a started `node`; returns both (the trainer is started).

    Call it from the thread that started the node: with `config.diloco` it forks the averager.
    """
    updates: UpdatesFactory = (
        every_step_updates if config.diloco is None else node_diloco_updates(node, config)
    )
    validator = make_validator(node, config)
    trainer = RLTrainer(
        node,
        config,
        TrainerJudge(validator, node.metrics),
        policy,
        checkpoint_dir=checkpoint_dir,
        on_step=on_step,
        updates=updates,
    )
    return trainer.start(), validator


class StandaloneValidator:
    """A validator node: follows the policy, judges submitted groups, forwards accepted rollouts."""

    def __init__(self, node: HivenetNode, config: RLRunConfig) -> None:
        assert node.dht is not None, "start the node first"
        self.node = node
        self.config = config
        self.validator = make_validator(node, config)
        self.device = resolve_device(node.config.device)
        self.broadcast = add_policy_follower(node, config)
        self.judging: CallBatcher[tuple[bytes, RolloutGroup], tuple[list[bytes], list[VerifiedRollout]]] = (
            CallBatcher(self.validator.judge_groups, linger_s=JUDGE_LINGER_S, max_batch=JUDGE_MAX_BATCH)
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
        self._forward_seq = itertools.count(time.time_ns())
        self._forward_failure_logged = LogOncePer(FORWARD_FAILURE_LOG_INTERVAL_S)
        self.forwards = node.add_service(
            ForwardQueue(
                node.config.weights_dir / f"{config.run_id}.forwards.db",
                send=self._forward,
                owner=node.short_id,
            )
        )
        """Accepted groups not yet taken by a trainer (durable: a worker is told "accepted" once its
        group is here)."""

    def start(self) -> StandaloneValidator:
        self.node.call(self._follow())
        return self

    async def _follow(self) -> None:
        # a restarted validator's store may hold the newest versions already: following fetches only newer ones
        for entry in held_versions(self.broadcast, self.config.run_id, self.config.grpo.async_level + 1):
            await self._on_version(entry)
        self.broadcast.follow(self.config.run_id, on_version=self._on_version)

    async def _on_version(self, entry: VersionEntry) -> None:
        state = await offload(entry.load_state_dict)
        model = await offload(model_from_state, self.config, state, torch.float32, self.device)
        self.validator.add_version(entry.version, model)
        self.validator.set_trainer_step(entry.version)

    async def _issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        return await offload(issue_tickets, self.validator, worker, count, version)

    async def _handle_group(self, worker: bytes, envelope: Envelope, group: RolloutGroup) -> list[bytes]:
        if self.forwards.full():  # before judging: the ticket stays open, the worker submits it again
            raise GroupRefused(
                "busy: no trainer has taken this validator's accepted groups lately; submit later"
            )
        started = time.monotonic()
        verdicts, accepted = await self.judging.submit((worker, group))
        count_verdicts(self.node.metrics, verdicts, time.monotonic() - started)
        if accepted:  # queued durably before the worker hears "accepted"
            await offload(self.forwards.put, envelope.sealed, verdicts, envelope.expires_at)
        return verdicts

    async def _forward(self, sealed_group: bytes, verdicts: list[bytes]) -> bool:
        """Hand the group and its receipts to one of the run's trainers, so that it is trained on once:
        the first in an order drawn from the group (every group has its own), the next if it fails;
        whether one took it."""
        publishers = set(self.config.authorized_publishers)
        trainers = [
            t for t in await offload(self.node.discover, Role.TRAINER) if t.peer_id.to_base58() in publishers
        ]
        trainers.sort(key=lambda t: hashlib.sha256(sealed_group[-64:] + t.peer_id.to_bytes()).digest())
        for trainer in trainers:
            try:
                await connect_member(self.broadcast.dialer, trainer)
                receipt = await forward_group(
                    self.broadcast.p2p,
                    trainer.peer_id,
                    private_key=self.node.identity.private_key,
                    run_id=self.config.run_id,
                    sealed_group=sealed_group,
                    sealed_verdicts=verdicts,
                    timeout_s=FORWARD_TIMEOUT_S,
                    seq=next(self._forward_seq),
                    on_receipts=self.node.receipt_sink,  # the trainer's validation receipt, checked
                )
            except (
                Exception
            ) as exc:  # the group stays queued: a restarting trainer fails every forward for a while
                level = logging.WARNING if self._forward_failure_logged(trainer.peer_id) else logging.DEBUG
                logger.log(
                    level,
                    "[%s] could not forward to trainer %s: %s",
                    self.node.short_id,
                    trainer.short_id,
                    exc,
                )
            else:
                if receipt is not None:
                    self.node.metrics.tokens_processed("validator", receipt.tokens)
                return True
        return False
