"""The DiLoCo optimizer and trainer loop: H inner AdamW steps, then one averaged outer Nesterov step.

Plain synchronous torch code. The network is reached only through two interfaces passed in
by `training.trainer` (both implemented by `node.collective.averager.GatherAverager`):

* `RoundAverager.average(...)` averages this round's pseudo-gradient with the peers of the
  same run and outer step (one round per outer step; every peer's contribution counts
  equally, whatever it claims) and returns the group's aggregate, identical on every member;
  `prepare_round` declares that round while the inner steps run.
* `StateSource.fetch_state()` downloads the current `OuterState` (outer parameters, outer
  momentum, step number) from peers, for late joiners and peers that fell out of sync.

The types these interfaces exchange belong to the averaging transport: `OuterState` and
`state_hash` live in `node.collective.outer_state`, `RoundOutcome`, `PendingAverage` and
`DoneAverage` in `node.collective.round_types`.

The outer step itself (`pseudo_gradient`, `outer_update`, `DiLoCoConfig`) lives in
`training.outer_step` and is re-exported here.

With `overlap_communication` (the default) the next round's inner steps run while this
round's exchange is in flight, and they start from the *eager* outer step: the update this
peer's own pseudo-gradient alone would give (the "eager updates" of overlapped DiLoCo). When
the group's average arrives a few inner steps later, only the difference between the group's
outer step and the eager one is applied, keeping the inner progress made meanwhile. The
steps taken before the average arrives thus start near where the synchronous schedule would
have put them, not at the pre-update local parameters, and a lone trainer (whose average is
its own pseudo-gradient) follows the synchronous trajectory exactly.

Main names: `DiLoCoConfig`, `pseudo_gradient`, `outer_update`, `DiLoCoTrainer`,
`OuterStepReport`, `RoundAverager`, `StateSource`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from node.collective.outer_state import OuterState
from node.collective.round_types import PendingAverage
from training.causal_lm import CausalLM
from training.outer_step import DiLoCoConfig, outer_update, pseudo_gradient
from training.state_check import held_out_loss, plausible_state

__all__ = [
    "DiLoCoConfig",
    "DiLoCoTrainer",
    "OuterStepReport",
    "RoundAverager",
    "StateSource",
    "outer_update",
    "pseudo_gradient",
]

logger = logging.getLogger(__name__)


class RoundAverager(Protocol):
    """Averages pseudo-gradients with the run's other trainers (implemented by `node.collective.averager.GatherAverager`)."""

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        """Start matchmaking for outer step `step`, needed in about `expected_duration_s` seconds."""
        ...

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        """Start averaging `pseudo_grads` with the group for `step`; `outer_hash` is this peer's state hash."""
        ...

    def bytes_sent(self) -> int:
        """Bytes this peer has written to the network for averaging and state sharing so far."""
        ...


@dataclass
class _Pending:
    handle: PendingAverage
    state: OuterState
    delta: list[torch.Tensor]
    start_params: list[torch.Tensor]
    """Where the next round's inner steps started: the eager outer step from our own `delta`."""
    train_loss: float
    tokens: int
    inner_steps_at_send: int


class StateSource(Protocol):
    """Downloads the run's current outer state from peers (implemented by `node.collective.averager.GatherAverager`)."""

    def fetch_state(self, *, newer_than: int, stop_event: threading.Event | None = None) -> OuterState | None:
        """The state of a peer at an outer step greater than `newer_than`, or None if none is
        available (or, at once, when `stop_event` is set: a stopping trainer keeps its own state)."""
        ...


@dataclass
class OuterStepReport:
    """Progress after one outer step, for the terminal, logs and the benchmark."""

    peer: str
    """Short PeerID (or name) of the reporting trainer."""

    outer_step: int
    """Outer steps applied so far (after this one)."""

    train_loss: float
    """Mean inner training loss over this round's inner steps."""

    eval_loss: float | None
    """Held-out loss of the new outer parameters, when evaluated this step."""

    num_peers: int
    """Peers whose pseudo-gradients were averaged in this round (1: alone)."""

    bytes_sent: int
    """Total bytes this trainer has sent to the network so far."""

    tokens: int
    """Training tokens this trainer had processed when it sent the pseudo-gradient of this outer
    step (so it grows by `inner_steps * batch tokens` per outer step, whether or not the next
    round's inner steps overlapped the exchange)."""

    outer_hash: str
    """`state_hash` of the new outer state; equal on every peer of a round."""

    inner_time_s: float
    """Total seconds spent in inner steps so far."""

    wall_time_s: float
    """Total seconds since the trainer started training."""

    resynced: bool = False
    """Whether this trainer downloaded the state from peers after this step (it was out of sync)."""

    refused_peers: int = 0
    """Contributions refused in this round."""

    extra: dict[str, float] = field(default_factory=dict)
    """Anything else worth plotting."""

    averaged_step: int = 0
    """The outer step whose pseudo-gradients this round averaged (`outer_step` before it was applied)."""

    round_id: bytes = b""
    """The averaging group's id (empty when the round was averaged alone)."""

    received_from: dict[bytes, int] = field(default_factory=dict)
    """Bytes received from each other member whose contribution was accepted (PeerID bytes): whom
    this trainer signs training receipts for."""


class DiLoCoTrainer:
    """Runs DiLoCo rounds on one model until stopped; the network is reached only through the interfaces given."""

    def __init__(
        self,
        model: CausalLM,
        config: DiLoCoConfig,
        *,
        next_batch: Callable[[], torch.Tensor],
        averager: RoundAverager,
        state_source: StateSource | None = None,
        initial_state: OuterState | None = None,
        eval_batches: Sequence[torch.Tensor] = (),
        name: str = "trainer",
        on_state_applied: Callable[[OuterState], None] | None = None,
    ) -> None:
        """`on_state_applied` sees each outer state once it is final (after a resync, if any) and
        before the next round is declared: the moment it can be served to peers."""
        self.model = model
        self.on_state_applied = on_state_applied
        self.config = config
        self.next_batch = next_batch
        self.averager = averager
        self.state_source = state_source
        self.eval_batches = list(eval_batches)
        self.name = name
        self.state = initial_state if initial_state is not None else OuterState.from_model(model)
        if not self.state.matches(model):
            raise ValueError("initial outer state does not fit the model's parameter shapes")
        self._lock = threading.Lock()
        self._load_into_model(self.state)
        self.inner_optimizer = self._new_inner_optimizer()
        self.tokens = 0
        self.inner_steps_done = 0
        self.global_inner_step = self.state.step * config.inner_steps
        """The run's inner step this trainer is at (drives the lr schedule; the same on every peer)."""
        self.inner_time_s = 0.0
        self.wait_time_s = 0.0
        self._step_time_s: float | None = None
        self._pending: _Pending | None = None
        self._stop_event: threading.Event | None = None
        """The stop event of the rounds being run: a resync download gives up when it is set."""

    # -- state -------------------------------------------------------------------------
    def _new_inner_optimizer(self) -> torch.optim.AdamW:
        c = self.config
        return torch.optim.AdamW(
            self.model.parameters(), lr=c.inner_lr, betas=c.inner_betas, weight_decay=c.inner_weight_decay
        )

    @torch.no_grad()
    def _load_into_model(self, state: OuterState) -> None:
        for p, o in zip(self.model.parameters(), state.params, strict=True):
            p.copy_(o)

    def current_state(self) -> OuterState:
        """A copy of the current outer state (served to peers that join late; written to checkpoints)."""
        with self._lock:
            return self.state.clone()

    def adopt_state(self, state: OuterState) -> None:
        """Replace the outer state (downloaded from peers) and restart the inner optimizer from it."""
        if not state.matches(self.model):
            raise ValueError("downloaded outer state does not fit the model's parameter shapes")
        with self._lock:
            self.state = state.clone()
        self._load_into_model(state)
        self.inner_optimizer = self._new_inner_optimizer()

    # -- one round ------------------------------------------------------------------------
    def _inner_lr(self) -> float:
        return self.config.inner_lr_at(self.global_inner_step)

    def inner_step(self) -> float:
        """One AdamW step on one batch; returns its loss."""
        batch = self.next_batch().to(self.model.device)
        for group in self.inner_optimizer.param_groups:
            group["lr"] = self._inner_lr()
        self.model.train()
        loss = self.model.loss(batch[:, :-1], batch[:, 1:])
        self.inner_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.inner_optimizer.step()
        self.inner_steps_done += 1
        self.global_inner_step += 1
        self.tokens += batch.shape[0] * (batch.shape[1] - 1)
        return float(loss.detach())

    def evaluate(self) -> float | None:
        """Mean held-out loss of the current outer parameters (None without eval batches)."""
        if not self.eval_batches:
            return None
        return held_out_loss(self.model, self.state.params, self.eval_batches)

    def _note_step_time(self, seconds: float, steps: int) -> None:
        per_step = seconds / max(1, steps)
        self._step_time_s = per_step if self._step_time_s is None else 0.5 * (self._step_time_s + per_step)

    def _prepare(self, remaining_steps: int) -> None:
        expected = (self._step_time_s or 0.0) * remaining_steps
        self.averager.prepare_round(self.state.step, expected, self.state.hash())

    def _finish_pending(self, *, wait: bool) -> OuterStepReport | None:
        """Apply the outer step of the round in flight once its average is known (None if not yet)."""
        pending = self._pending
        assert pending is not None
        if not wait and not pending.handle.done():
            return None
        t0 = time.perf_counter()
        outcome = pending.handle.result()
        self.wait_time_s += time.perf_counter() - t0
        self._pending = None
        averaged = outcome.averaged if outcome.averaged is not None else pending.delta
        new_state = outer_update(pending.state, averaged, self.config)
        with self._lock:
            self.state = new_state
        # Keep the inner progress made since the eager start, on top of the group's outer step.
        with torch.no_grad():
            for p, o, start in zip(
                self.model.parameters(), new_state.params, pending.start_params, strict=True
            ):
                if not torch.equal(o, start):  # o + (p - o) can differ from p by rounding
                    p.copy_(o + (p.detach().to(o.device) - start))
        steps_until_average = self.inner_steps_done - pending.inner_steps_at_send
        resynced = False
        if not outcome.in_sync and self.state_source is not None:
            fetched = self.state_source.fetch_state(
                newer_than=pending.state.step, stop_event=self._stop_event
            )
            if (
                fetched is not None
                and fetched.matches(self.model)
                and plausible_state(self.model, self.state, fetched, self.eval_batches, name=self.name)
            ):
                logger.warning("%s: outer state disagreed with the group; adopted a peer's state", self.name)
                self.adopt_state(fetched)
                resynced = True
        if self.on_state_applied is not None:
            self.on_state_applied(self.state)
        every = self.config.eval_every_outer_steps
        eval_loss = self.evaluate() if every and self.state.step % every == 0 else None
        return OuterStepReport(
            peer=self.name,
            outer_step=self.state.step,
            train_loss=pending.train_loss,
            eval_loss=eval_loss,
            num_peers=outcome.num_peers,
            bytes_sent=self.averager.bytes_sent(),
            tokens=pending.tokens,
            outer_hash=self.state.hash(),
            inner_time_s=self.inner_time_s,
            wall_time_s=0.0,
            resynced=resynced,
            refused_peers=outcome.refused_peers,
            extra={
                "steps_until_average": float(steps_until_average),
            },
            averaged_step=pending.state.step,
            round_id=outcome.round_id,
            received_from=dict(outcome.received_bytes),
        )

    def run_round(self, stop_event: threading.Event | None = None) -> list[OuterStepReport] | None:
        """H inner steps, then send the pseudo-gradient; return the outer steps completed meanwhile.

        Without `overlap_communication` the round waits for its average and applies the outer
        step before returning. With it, the next round's inner steps start from the eager outer
        step (our own pseudo-gradient's), the group's average arrives while they run and only
        its difference from the eager step is applied (the inner progress made meanwhile is
        kept). Stopped during the inner steps: the outer steps completed so far in this round, or
        None if there were none.
        """
        reports: list[OuterStepReport] = []
        if stop_event is not None:
            self._stop_event = stop_event
        # This round averages for outer step `state.step` (+1 while the previous round is in flight).
        round_step = self.state.step + (0 if self._pending is None else 1)
        self.global_inner_step = round_step * self.config.inner_steps
        if self._pending is None:
            self._prepare(self.config.inner_steps)
        losses = []
        t0 = time.perf_counter()
        for h in range(self.config.inner_steps):
            if stop_event is not None and stop_event.is_set():
                self.inner_time_s += time.perf_counter() - t0
                return reports or None
            losses.append(self.inner_step())
            if self._pending is not None:
                now = time.perf_counter()
                self.inner_time_s += now - t0
                report = self._finish_pending(wait=False)
                if report is not None:
                    reports.append(report)
                    self._prepare(self.config.inner_steps - h - 1)
                t0 = time.perf_counter()
        inner = time.perf_counter() - t0
        self.inner_time_s += inner
        if self._pending is not None:  # the previous round's average is late: wait for it now
            report = self._finish_pending(wait=True)
            assert report is not None
            reports.append(report)
            self._prepare(0)
        self._note_step_time(inner, self.config.inner_steps)
        params = [p.detach().to("cpu", copy=True) for p in self.model.parameters()]
        delta = pseudo_gradient(self.state.params, params)
        handle = self.averager.start_average(delta, step=self.state.step, outer_hash=self.state.hash())
        eager = outer_update(self.state, delta, self.config)
        self._load_into_model(eager)
        self._pending = _Pending(
            handle,
            self.state,
            delta,
            eager.params,
            sum(losses) / len(losses),
            self.tokens,
            self.inner_steps_done,
        )
        if not self.config.overlap_communication or self._last_round():
            report = self._finish_pending(wait=True)
            assert report is not None
            reports.append(report)
        return reports

    def _last_round(self) -> bool:
        limit = self.config.max_outer_steps
        return limit is not None and self.state.step + 1 >= limit

    def run(
        self,
        stop_event: threading.Event,
        on_progress: Callable[[OuterStepReport], None] | None = None,
        on_outer_step: Callable[[DiLoCoTrainer], None] | None = None,
    ) -> list[OuterStepReport]:
        """Run rounds until `stop_event` is set or `max_outer_steps` is reached; return the reports."""
        all_reports: list[OuterStepReport] = []
        start = time.perf_counter()
        limit = self.config.max_outer_steps
        try:
            while not stop_event.is_set() and (limit is None or self.state.step < limit):
                reports = self.run_round(stop_event)
                if reports is None:
                    break
                for report in reports:
                    self._emit(report, start, all_reports, on_progress, on_outer_step)
        finally:
            if self._pending is not None:  # stopping: finish the round in flight so the state is whole
                last = self._finish_pending(wait=True)
                if last is not None:
                    self._emit(last, start, all_reports, on_progress, on_outer_step)
            self._load_into_model(self.state)
        return all_reports

    def _emit(
        self,
        report: OuterStepReport,
        start: float,
        reports: list[OuterStepReport],
        on_progress: Callable[[OuterStepReport], None] | None,
        on_outer_step: Callable[[DiLoCoTrainer], None] | None,
    ) -> None:
        report.wall_time_s = time.perf_counter() - start
        report.inner_time_s = self.inner_time_s
        reports.append(report)
        # whoever consumes the progress shows it; the log line is for runs without a consumer
        logger.log(
            logging.DEBUG if on_progress is not None else logging.INFO,
            "%s: outer step %d loss %.4f peers %d hash %s bytes %d",
            self.name, report.outer_step, report.train_loss, report.num_peers, report.outer_hash,
            report.bytes_sent,
        )  # fmt: skip
        if on_outer_step is not None:
            on_outer_step(self)
        if on_progress is not None:
            on_progress(report)
