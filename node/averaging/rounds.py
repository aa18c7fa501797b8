"""Averaging rounds, as the trainer sees them: prepare, start, wait, and what a round gave.

* `RoundOutcome`: the group's average (identical on every member), how many peers it holds,
  whether this peer is still in sync. `PendingAverage` is a round in flight; `DoneAverage`
  one whose outcome was known at once (e.g. no peer around).
* `Rounds` is a mixin of `node.averaging.averager.DiLoCoAverager`. **Matchmaking ahead of
  time:** `prepare_round` starts matchmaking for outer step `t` when the inner steps start,
  with the all-reduce scheduled for when they are expected to end; `start_average` then only
  triggers it. Groups are keyed by the outer step (the group bits encode `t`), so peers only
  ever average pseudo-gradients of the same step. A round that fails in any way (no group,
  timeouts, peers gone) is averaged alone; a round that most live peers have moved past is
  given up early and reported out of sync (see `_wait_for_round`): the peer is behind the run,
  and its lone outer step is nobody else's state.
* The round's outcome records the majority state hash of the group (its holders become the
  preferred state sources) and whether every reducer answered: a member left out of part of
  the round holds its own values in that slice, so it reports itself out of sync. It also names
  the group and the bytes received from each member whose contribution was accepted, which is
  what a trainer signs training receipts for.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Protocol

import torch
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from node.averaging.runner import global_norm
from node.averaging.state_sync import StateSharing

__all__ = ["DoneAverage", "PendingAverage", "PendingRound", "RoundOutcome", "Rounds"]

logger = logging.getLogger(__name__)

_PEER_POLL_S = 1.0


@dataclass
class RoundOutcome:
    """What one averaging round gave this peer."""

    averaged: list[torch.Tensor] | None
    """The group's mean pseudo-gradient (identical on every member), or None if no round took place."""

    num_peers: int
    """Peers whose contribution is in the average (1 if this peer averaged alone)."""

    in_sync: bool = True
    """False if this peer's outer state hash disagreed with the majority of its group, if it got only
    part of the group's average (a reducer left it out), or if most live peers had moved past its
    round (it is behind the run): in each case it must resync."""

    refused_peers: int = 0
    """Senders whose contributions were refused (non-finite, oversized or malformed) in this round."""

    round_id: bytes = b""
    """The averaging group's id (empty if no round took place): the evidence of a training receipt."""

    received_bytes: dict[bytes, int] = field(default_factory=dict)
    """Bytes received from each other member whose contribution was accepted (PeerID bytes): the
    members this peer can sign a training receipt for."""

    disputed_parts: int = 0
    """Parts of the average left at zero because their two reducers disagreed (`node.averaging.audit`)."""


class PendingAverage(Protocol):
    """An averaging round in flight."""

    def done(self) -> bool:
        """Whether `result` would return at once."""
        ...

    def result(self) -> RoundOutcome:
        """Wait for the round and return its outcome (never raises: a failed round is averaged alone)."""
        ...


class _LeftBehind(MatchmakingException):
    """Most live peers of the run advertise a later outer step than the round's."""


class DoneAverage:
    """A `PendingAverage` whose outcome is already known."""

    def __init__(self, outcome: RoundOutcome) -> None:
        self.outcome = outcome

    def done(self) -> bool:
        return True

    def result(self) -> RoundOutcome:
        return self.outcome


class Rounds(StateSharing):
    """Prepared, triggered and awaited averaging rounds of a `DiLoCoAverager` (see module docstring)."""

    # Provided by `DiLoCoAverager`.
    averaging_timeout_s: float
    _matchmaking_time_s: float
    _last_average_norm: Synchronized[float]  # read by the all-reduce runner in the averager process

    def _init_rounds(self) -> None:
        """Set up this mixin's fields; called before hivemind starts the averager process."""
        self._control: StepControl | None = None
        self._control_step = -1

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str = "") -> None:
        """Start matchmaking for outer step `step` so that the group is ready when the inner steps end."""
        self.cancel_round()
        self.set_group_bits(bin(step)[2:], wait=False)  # the pipe keeps order: applied before the step
        lead = max(self._matchmaking_time_s, 0.9 * expected_duration_s)
        scheduled = get_dht_time() + lead
        self._control = self.step(
            gather={"step": step, "hash": outer_hash},
            scheduled_time=scheduled,
            timeout=lead + self.averaging_timeout_s,
            require_trigger=True,
            allow_retries=True,
            wait=False,
        )
        self._control_step = step

    def cancel_round(self) -> None:
        """Abandon a prepared round (if any)."""
        if self._control is not None and not self._control.done():
            self._control.cancel()
        self._control = None

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        """Start averaging `pseudo_grads` with the group of `step` (alone if no peer is around)."""
        if self._control is None or self._control_step != step:
            self.prepare_round(step, 0.0, outer_hash)
        control = self._control
        assert control is not None
        self._control = None
        # A group that is already assembled (matchmaking ran during the inner steps) proves that
        # peers are there; only otherwise ask the DHT, whose latency would delay the all-reduce.
        assembled = control.stage == AveragingStage.AWAITING_TRIGGER
        if not assembled and not self.has_peers():
            control.cancel()
            return DoneAverage(RoundOutcome(averaged=None, num_peers=1))
        with self.get_tensors() as tensors:
            for buffer, value in zip(tensors, pseudo_grads, strict=True):
                buffer.copy_(value)
        control.allow_allreduce()
        return PendingRound(self, control, step, outer_hash)

    def average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> RoundOutcome:
        """`start_average(...).result()`: average and wait."""
        return self.start_average(pseudo_grads, step=step, outer_hash=outer_hash).result()

    def _wait_for_round(self, control: StepControl, step: int) -> Any:
        """`control.result()`, but give up on a round that the run has left.

        A peer that advertises a later outer step has left round `step`: it averaged without us or
        gave up on it. Once most live peers have (the median advertised step is past ours), waiting
        out the timeout would only put us a whole matchmaking window behind them: each of our later
        rounds would start just as theirs timed out, and no round would find a group again ("could
        not find a group" every round, seen after one trainer stepped alone early). Giving up
        (`_LeftBehind`: the outcome is out of sync, so the trainer downloads the run's state) lets
        us meet them at the next step; keeping a lone outer step would leave us off the run's state.
        The median, not the minimum: a dead peer's advertisement outlives it by up to the
        averager's `declare_state_period`, so under churn some dead or dying peer nearly always
        advertises an older step, and a trainer that missed one group waited out the whole
        timeout round after round, stepping alone each time (seen in the churn soak).
        """
        deadline = time.monotonic() + control.get_timeout() + self.averaging_timeout_s
        while True:
            try:
                return control.result(timeout=min(_PEER_POLL_S, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                if control.done() or time.monotonic() >= deadline:
                    raise
            if control.stage == AveragingStage.LOOKING_FOR_GROUP:
                steps = self.peer_steps()
                if steps and statistics.median_low(steps.values()) > step:
                    raise _LeftBehind(f"most live peers have moved past outer step {step}")

    def _round_outcome(self, control: StepControl, step: int, outer_hash: str) -> RoundOutcome:
        try:
            result = self._wait_for_round(control, step)
        except Exception as e:  # any failure of the round (no group, timeouts, peers gone): step alone
            logger.info("%s: outer step %d averaged alone (%r)", self.label, step, e)
            with contextlib.suppress(Exception):
                control.cancel()
            if self._last_average_norm.value == 0.0:
                # Never averaged with a group yet: our own pseudo-gradient (a whole round of inner
                # steps) is the best scale we know for the next round's norm bound. Without one, a
                # peer that resynced mid-round sent a few inner steps' worth, bounded others by that,
                # and refused and banned honest peers (churn soak).
                with self.get_tensors() as tensors:
                    own = global_norm(tensors)
                if math.isfinite(own):
                    self._last_average_norm.value = own
            return RoundOutcome(averaged=None, num_peers=1, in_sync=not isinstance(e, _LeftBehind))
        if not result:
            return RoundOutcome(averaged=None, num_peers=1)
        gathered: dict[bytes, Any] = result["gathered"]
        hashes = {peer: info.get("hash") for peer, info in gathered.items() if isinstance(info, dict)}
        counts = Counter(h for h in hashes.values() if isinstance(h, str))
        majority = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else outer_hash
        self.prefer_state_sources(
            [PeerID(p) for p, h in hashes.items() if h == majority and p != self.peer_id.to_bytes()]
        )
        with self.get_tensors() as tensors:
            averaged = [t.clone() for t in tensors]
        norm = global_norm(averaged)
        if math.isfinite(norm):
            self._last_average_norm.value = norm
        if len(gathered) > 1:
            self.note_peers_alive()
        complete = bool(result.get("complete", True))
        if not complete:
            logger.warning("%s: outer step %d got only part of the group's average", self.label, step)
        in_sync = outer_hash == majority and complete
        self._state_doubtful = not in_sync  # stop serving a state we know others do not hold
        own = self.peer_id.to_bytes()
        received = result.get("received", {})
        return RoundOutcome(
            averaged=averaged,
            num_peers=len(gathered) - int(result["refused"]),
            in_sync=in_sync,
            refused_peers=int(result["refused"]),
            round_id=bytes(result.get("group_id", b"")),
            received_bytes={peer: int(n) for peer, n in received.items() if peer != own and n > 0},
            disputed_parts=int(result.get("disputed", 0)),
        )


class PendingRound:
    """A round in flight on a `DiLoCoAverager` (a `PendingAverage`)."""

    def __init__(self, averager: Rounds, control: StepControl, step: int, outer_hash: str) -> None:
        self.averager, self.control, self.step, self.outer_hash = averager, control, step, outer_hash
        self._outcome: RoundOutcome | None = None

    def done(self) -> bool:
        return self._outcome is not None or self.control.done()

    def result(self) -> RoundOutcome:
        if self._outcome is None:
            self._outcome = self.averager._round_outcome(self.control, self.step, self.outer_hash)
        return self._outcome
