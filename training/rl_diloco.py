"""Several RL trainers training one policy together: GRPO inner steps, DiLoCo outer steps.

Each trainer makes GRPO steps on the rollouts its own validator accepted (`RLTrainer` as
usual); after every `RLDiLoCoConfig.inner_steps` of them, `DiLoCoUpdates` averages its
pseudo-gradient (outer parameters - local parameters) with the run's other trainers through
the node's averaging service (`node.collective.averager.GatherAverager`: one round whose
aggregate is bit-identical on every member) and applies the same outer Nesterov step
(`training.outer_step.outer_update`). Every trainer then holds the same outer parameters and
momentum, and publishes the outer parameters as policy version = outer step: identical
weights, identical chunks, so workers can take them from any trainer and any trainer's
validator can verify rollouts generated on any trainer's copy.

Versions. Workers generate with outer versions only, so staleness and GRPO's behaviour
log-probs refer to them: `OuterVersionLearner` keeps the weights of the newest
`async_level + 1` outer versions (not of the inner steps), and within a round treats even
the current outer version's rollouts as off-policy once an inner step has moved the weights.
Inside the learner, outer version V is numbered `V * (H + 1)` and the inner steps of its round
`V * (H + 1) + h` (h = 1..H), so the two never collide.

A round that could not average with anybody (no other trainer, timeouts) steps alone; a
trainer whose state hash disagreed with its group's majority downloads the majority's state
when two other trainers confirm it (`StateSource`), and only if its loss on the latest rollouts
this trainer trained on is not far above its own state's (`training.state_check`: sources that
agree may be one attacker's identities, and a poisoned state cannot predict the policy's own
samples). The outer momentum is checkpointed with the
policy (`DiLoCoUpdates.saved_state`).

Receipts. Every outer step is also reported as a `training.diloco.OuterStepReport` (`on_round`);
`node_diloco_updates` builds the updates of a trainer on a node, whose reports become training
receipts (`training.trainer_node.sign_training_receipts`, one per other member whose
contribution the round accepted) in the node's ledger. What a receipt says a member trained is
`rl_tokens_per_outer_step(config)`, a figure of the run's config, never a member's claim.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from hivemind import DHT

from node.collective.outer_state import OuterState
from node.node import HivenetNode
from training.averagers import rl_averager
from training.causal_lm import CausalLM
from training.checkpoint import CheckpointError
from training.diloco import OuterStepReport, RoundAverager, StateSource
from training.grpo import GRPOConfig, GRPOLearner, GRPOStepReport, ScoredRollout
from training.outer_step import DiLoCoConfig, outer_update, pseudo_gradient
from training.rl_run import RLDiLoCoConfig, RLRunConfig, run_task
from training.state_check import plausible_state
from training.trainer_node import sign_training_receipts

__all__ = [
    "DiLoCoUpdates",
    "OuterStepRecord",
    "OuterVersionLearner",
    "diloco_updates",
    "node_diloco_updates",
    "rl_tokens_per_outer_step",
]

logger = logging.getLogger(__name__)

_CHECK_SEQUENCES = 16


class OuterVersionLearner(GRPOLearner):
    """A GRPO learner whose behaviour weights are those of the run's outer versions (see module docstring)."""

    def __init__(self, model: CausalLM, config: GRPOConfig, *, inner_steps: int, outer_version: int) -> None:
        self.spacing = inner_steps + 1
        super().__init__(model, config, version=outer_version * self.spacing)

    def internal(self, outer_version: int) -> int:
        """The learner's number for outer version `outer_version`."""
        return outer_version * self.spacing

    @property
    def known_versions(self) -> list[int]:
        """The outer versions whose weights the learner holds (rollouts carry outer versions)."""
        return sorted(v // self.spacing for v in self._history)

    def _remember(self) -> None:
        """Snapshot the weights only at outer versions; keep the newest `async_level + 1` of them."""
        if self.version % self.spacing == 0:
            self._history[self.version] = self.state_dict()
        oldest = self.version - self.version % self.spacing - self.config.async_level * self.spacing
        for v in [v for v in self._history if v < oldest or v > self.version]:
            del self._history[v]

    def outer_step(self, state: OuterState) -> None:
        """Take the outer parameters of `state` as outer version `state.step` (the inner optimizer stays)."""
        with torch.no_grad():
            for p, o in zip(self.model.parameters(), state.params, strict=True):
                p.copy_(o)
        self.version = self.internal(state.step)
        self._remember()

    def inner_step(self, groups: Sequence[Sequence[ScoredRollout]]) -> GRPOStepReport:
        """One GRPO step on rollouts labelled with outer versions."""
        return self.step(
            [[replace(r, policy_version=self.internal(r.policy_version)) for r in g] for g in groups]
        )


@dataclass(frozen=True)
class OuterStepRecord:
    """One outer step of one trainer."""

    version: int
    """The outer step reached (the policy version published for it)."""
    state_hash: str
    """`OuterState.hash()` after the step: equal on every trainer of the round."""
    num_peers: int
    """Trainers whose pseudo-gradients were averaged (1: alone)."""
    resynced: bool = False


class DiLoCoUpdates:
    """`training.policy_updates.PolicyUpdates` for a trainer among several: a version every H GRPO steps."""

    def __init__(
        self,
        learner: OuterVersionLearner,
        config: RLDiLoCoConfig,
        averager: RoundAverager,
        *,
        state_source: StateSource | None = None,
        on_outer_step: Callable[[OuterState], None] | None = None,
        on_round: Callable[[OuterStepReport], None] | None = None,
        close: Callable[[], None] | None = None,
        name: str = "trainer",
    ) -> None:
        """`on_round`: handed each outer step's report (its round id and the members whose
        contributions were accepted: what training receipts are signed for)."""
        self.learner = learner
        self.config = config
        self.averager = averager
        self.state_source = state_source
        self.on_outer_step = on_outer_step
        self.on_round = on_round
        self._close = close
        self.name = name
        self.outer = DiLoCoConfig(
            inner_steps=config.inner_steps, outer_lr=config.outer_lr, outer_momentum=config.outer_momentum
        )
        self.state = OuterState.from_model(learner.model, step=learner.version // learner.spacing)
        self.inner_done = 0
        """GRPO steps made in the current round."""
        self.records: list[OuterStepRecord] = []
        self._round_losses: list[float] = []
        self._inner_time_s = 0.0
        self._tokens = 0
        """Completion tokens trained on since this trainer started (what GRPO's loss covers)."""
        self._recent: deque[torch.Tensor] = deque(maxlen=_CHECK_SEQUENCES)
        """The latest rollouts trained on (prompt and completion), for checking a downloaded state."""
        self._started = time.monotonic()
        self._round_started = self._started
        self._last_round_s = 0.0
        self._declare_round()

    def _declare_round(self) -> None:
        """Tell the run which outer step we train towards now, so that a trainer reaching the boundary
        first waits for us (up to its averaging timeout) instead of averaging alone. When the inner
        steps end depends on when rollouts arrive: the last round's length is the guess."""
        self._round_started = time.monotonic()
        self.averager.prepare_round(self.state.step, self._last_round_s, self.state.hash())

    @property
    def version(self) -> int:
        return self.state.step

    def current_state(self) -> OuterState:
        """A copy of the outer state (served to trainers that resync)."""
        return self.state.clone()

    def step(
        self, batch: Sequence[Sequence[ScoredRollout]], *, stop_event: threading.Event | None = None
    ) -> tuple[GRPOStepReport, bool]:
        started = time.monotonic()
        report = self.learner.inner_step(batch)
        self._inner_time_s += time.monotonic() - started
        self._round_losses.append(float(report.loss))
        self._tokens += report.num_tokens
        self._recent.extend(
            torch.tensor([r.prompt_ids + r.completion_ids], dtype=torch.long)
            for group in batch
            for r in group
            if len(r.prompt_ids) + len(r.completion_ids) >= 2
        )
        self.inner_done += 1
        if self.inner_done < self.config.inner_steps:
            return report, False
        self.inner_done = 0
        self._outer_step(stop_event)
        return report, True

    def _outer_step(self, stop_event: threading.Event | None) -> None:
        before = self.state
        local = [p.detach().clone() for p in self.learner.model.parameters()]
        delta = pseudo_gradient(before.params, local)
        outcome = self.averager.start_average(delta, step=before.step, outer_hash=before.hash()).result()
        averaged = outcome.averaged if outcome.averaged is not None else delta
        state = outer_update(before, averaged, self.outer)
        resynced = False
        if not outcome.in_sync and self.state_source is not None:
            fetched = self.state_source.fetch_state(newer_than=before.step, stop_event=stop_event)
            if (
                fetched is not None
                and fetched.matches(self.learner.model)
                and plausible_state(self.learner.model, state, fetched, list(self._recent), name=self.name)
            ):
                logger.warning("%s: outer state disagreed with the group; adopted a peer's state", self.name)
                state, resynced = fetched, True
        self.state = state
        self.learner.outer_step(state)
        self._last_round_s = time.monotonic() - self._round_started
        self._declare_round()
        record = OuterStepRecord(state.step, state.hash(), outcome.num_peers, resynced)
        self.records.append(record)
        logger.info(
            "%s: outer step %d with %d trainers, state %s", self.name, state.step, record.num_peers,
            record.state_hash,
        )  # fmt: skip
        if self.on_outer_step is not None:
            self.on_outer_step(state)
        losses, self._round_losses = self._round_losses, []
        if self.on_round is not None:
            self.on_round(
                OuterStepReport(
                    peer=self.name,
                    outer_step=state.step,
                    train_loss=statistics.fmean(losses) if losses else float("nan"),
                    eval_loss=None,
                    num_peers=outcome.num_peers,
                    bytes_sent=self.averager.bytes_sent(),
                    tokens=self._tokens,
                    outer_hash=record.state_hash,
                    inner_time_s=self._inner_time_s,
                    wall_time_s=time.monotonic() - self._started,
                    resynced=resynced,
                    refused_peers=outcome.refused_peers,
                    averaged_step=before.step,
                    round_id=outcome.round_id,
                    received_from=dict(outcome.received_bytes),
                )
            )

    def saved_state(self) -> dict[str, torch.Tensor]:
        """The outer momentum (the outer parameters are the checkpointed policy's weights)."""
        return {f"outer_momentum.{i}": m.clone() for i, m in enumerate(self.state.momentum)}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        """Take back the outer momentum of a checkpoint written by `saved_state`."""
        params = self.state.params
        names = [f"outer_momentum.{i}" for i in range(len(params))]
        if sorted(saved) != sorted(names):
            raise CheckpointError(
                "the checkpoint holds no DiLoCo outer momentum for this model (written without DiLoCo, or "
                "for another model): resume it with the settings it was written with"
            )
        momentum = [saved[name] for name in names]
        for m, p in zip(momentum, params, strict=True):
            if m.dtype != p.dtype or m.shape != p.shape or not bool(torch.isfinite(m).all()):
                raise CheckpointError(
                    "the checkpoint's outer momentum does not fit the model or is not finite"
                )
        self.state = OuterState(list(params), [m.clone() for m in momentum], self.state.step)
        self._declare_round()  # the state's hash changed with its momentum

    def close(self) -> None:
        if self._close is not None:
            self._close()


def rl_tokens_per_outer_step(config: RLRunConfig) -> int:
    """What one trainer of an RL DiLoCo run trains on per outer step, by the run's config: H GRPO
    steps of `groups_per_step` groups of `group_size` rollouts, each with the task's completion
    budget (`max_new_tokens`) of tokens. GRPO's loss covers completion tokens only (the prompt
    is context); a rollout may stop early, but how many tokens another trainer really trained on
    is its own claim, so a training receipt states this budget, the same for every member."""
    assert config.diloco is not None, "an RL run trains with DiLoCo only with `diloco` set"
    grpo = config.grpo
    return (
        config.diloco.inner_steps * grpo.groups_per_step * grpo.group_size * run_task(config).max_new_tokens
    )


def diloco_updates(
    dht: DHT,
    run_id: str,
    config: RLDiLoCoConfig,
    *,
    name: str,
    authorized_publishers: Sequence[str] = (),
    admitted_trainers: Sequence[str] = (),
    on_round: Callable[[OuterStepReport], None] | None = None,
) -> Callable[[CausalLM, GRPOConfig, int], DiLoCoUpdates]:
    """An `RLTrainer` updates factory: GRPO with `config`'s DiLoCo, averaging over `dht` with `run_id`'s trainers.

    A resync takes the verified outer state of one of `authorized_publishers` (base58 PeerIDs,
    the run's other trainers) on its own; anyone else's needs a second source that agrees. With
    `admitted_trainers` (base58 PeerIDs), only those trainers are averaged with.
    `on_round` is handed each outer step's report (see `DiLoCoUpdates`).
    """

    def build(policy: CausalLM, grpo: GRPOConfig, version: int) -> DiLoCoUpdates:
        learner = OuterVersionLearner(policy, grpo, inner_steps=config.inner_steps, outer_version=version)
        averager = rl_averager(
            config,
            dht,
            run_id=run_id,
            name=name,
            shapes=[p.shape for p in policy.parameters()],
            min_norm_per_value=config.min_norm_per_value or grpo.lr * config.inner_steps,
            authorized_publishers=authorized_publishers,
            admitted_trainers=admitted_trainers,
        )

        def shutdown() -> None:
            averager.cancel_round()
            averager.shutdown()

        updates = DiLoCoUpdates(
            learner,
            config,
            averager,
            state_source=averager,
            on_outer_step=lambda state: averager.publish_step(state.step),
            on_round=on_round,
            close=shutdown,
            name=name,
        )
        averager.set_state_provider(updates.current_state)
        averager.publish_step(updates.version)
        return updates

    return build


def node_diloco_updates(
    node: HivenetNode, config: RLRunConfig
) -> Callable[[CausalLM, GRPOConfig, int], DiLoCoUpdates]:
    """The updates factory of an RL trainer on a started `node` training with `config.diloco`.

    It averages over the node's DHT, resyncs from the run's authorised publishers and, on a node
    with a ledger, signs a training receipt after every outer step for each other member whose
    contribution its round accepted (`sign_training_receipts`, `rl_tokens_per_outer_step`), kept
    in the node's ledger (`node.receipt_sink`).
    """
    assert node.dht is not None, "start the node first"
    assert config.diloco is not None, "the run trains with DiLoCo only with `diloco` set"
    sink = node.receipt_sink
    tokens_trained = rl_tokens_per_outer_step(config)

    def sign_receipts(report: OuterStepReport) -> None:
        if sink is not None:
            sink(sign_training_receipts(
                report, node.identity.private_key, run_id=config.run_id, tokens_trained=tokens_trained
            ))  # fmt: skip

    return diloco_updates(
        node.dht,
        config.run_id,
        config.diloco,
        name=node.short_id,
        authorized_publishers=config.authorized_publishers,
        admitted_trainers=config.admitted_trainers,
        on_round=sign_receipts,
    )
