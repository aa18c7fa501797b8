"""`GatherAverager`: the averaging service as a trainer's synchronous averager and state source.

The training loop (`training.diloco`) runs in a thread of its own and sees the network through
two small interfaces, `RoundAverager` and `StateSource`. This class implements both on top of
the node's event loop (`node.runtime.NodeRuntime`): it hosts an `AveragingService` (the
rounds) and a `StateService` (outer-state serving and downloads) on one replicated P2P client
of the node's own daemon, and bridges each call with `runtime.submit` / `runtime.call`. There is
no averager process: a trainer is its node's process and that node's p2pd.

Who counts as a witness for a downloaded state: a trainer that has averaged in sync with us
(`AveragingService.standing`) or that the run names. A trainer with such evidence never takes a
state that only identities without it agree on; a newcomer with none falls back to two agreeing
sources, or an authorised publisher, as before. Evidence counts while its peers live: a trainer
whose every partner with standing has left (their round declarations expired) is a newcomer again,
or it could never resync to the trainers that carry the run on. One exception: a trainer whose only live partner
is a trainer it has averaged in sync with takes that partner's state on its word
(`_sole_partner`). Two survivors of a run whose states diverged (a member died mid-round) have no
second source and would otherwise never reconverge; a sole partner already holds half of every
average the trainer takes, and the trainer's own loss check (`training.state_check`) still applies.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import hivemind
import torch
from hivemind.p2p import PeerID

from node.bans import BanList
from node.collective.codecs import PseudoGradCodec
from node.collective.config import AveragingConfig
from node.collective.members import live_standing, state_sources
from node.collective.outer_state import OuterState
from node.collective.round_types import DoneAverage, PendingAverage, RoundOutcome
from node.collective.service import AveragingService
from node.collective.state_service import StateService, StateServiceConfig
from node.dht_node import signing_key_of
from node.rollouts.peers import replicate_p2p
from node.runtime import NodeRuntime
from protocol.averaging_round import RoundDeclaration

__all__ = ["GatherAverager"]

logger = logging.getLogger(__name__)

_DECLARATIONS_CACHE_S = 5.0
_PEER_POLL_S = 0.5

T = TypeVar("T")


class _Pending:
    """A round in flight on the event loop; `result` never raises (a failed round is averaged alone)."""

    def __init__(
        self, future: concurrent.futures.Future[RoundOutcome], label: str, codec: PseudoGradCodec
    ) -> None:
        self.future = future
        self.label = label
        self.codec = codec

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> RoundOutcome:
        try:
            return self.future.result()
        except Exception as exc:
            logger.warning("%s: averaging round failed (%r); stepping alone", self.label, exc)
            self.codec.reset()  # the whole pseudo-gradient is applied: nothing is owed to later rounds
            return RoundOutcome(None, 1)


def _unless_stopped(future: concurrent.futures.Future[T], stop: threading.Event) -> T | None:
    """`future`'s result, or None (the future cancelled) once `stop` is set first."""
    while not stop.is_set():
        try:
            return future.result(timeout=_PEER_POLL_S)
        except concurrent.futures.TimeoutError:
            continue
    future.cancel()
    return None


class GatherAverager:
    """A trainer's averager on the node's event loop (see module docstring)."""

    def __init__(
        self,
        shapes: Sequence[torch.Size],
        dht: hivemind.DHT,
        *,
        prefix: str,
        codec: PseudoGradCodec,
        config: AveragingConfig,
        state_config: StateServiceConfig | None = None,
        trusted_state_sources: Sequence[PeerID] = (),
        admitted_trainers: Sequence[PeerID] = (),
        name: str = "trainer",
        runtime: NodeRuntime | None = None,
    ) -> None:
        key = signing_key_of(dht)
        if key is None:
            raise ValueError(
                "the averaging service signs with its DHT's key: start the DHT with hivenet's start_dht"
            )
        self.label = name
        self.shapes = [torch.Size(s) for s in shapes]
        self.config = config
        self._own_runtime = runtime is None
        self.runtime = runtime if runtime is not None else NodeRuntime(f"{name}-averaging").start()
        self.admitted = frozenset(p.to_bytes() for p in admitted_trainers) or None
        self.trusted = frozenset(p.to_bytes() for p in trusted_state_sources)
        self.bans = BanList(config.ban_base_s, config.ban_max_s, owner=name)
        self.p2p = self.runtime.call(replicate_p2p(dht))
        self.rounds = AveragingService(
            dht=dht,
            signing_key=key,
            prefix=prefix,
            codec=codec,
            config=config,
            admitted=self.admitted,
            p2p=self.p2p,
            bans=self.bans,
            label=name,
        )
        self.states = StateService(
            self.p2p,
            proto=f"/hivenet/outer-state/1/{prefix}",
            shapes=[tuple(s) for s in self.shapes],
            config=state_config or StateServiceConfig(),
            bans=self.bans,
            label=name,
        )
        self.runtime.add_service(self.rounds)
        self.runtime.add_service(self.states)
        self._provider: Callable[[], OuterState] | None = None
        self._doubtful = False
        self._declared: dict[bytes, RoundDeclaration] = {}
        self._declared_at = -float("inf")
        self._closed = False
        self._declaring: set[concurrent.futures.Future[None]] = set()

    # ---- RoundAverager -----------------------------------------------------------------------

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        gather_at = time.time() + max(0.0, expected_duration_s)
        declaring = self.runtime.submit(
            self.rounds.declare(step, outer_hash, gather_at, serves_state=not self._doubtful)
        )
        self._declaring.add(declaring)
        declaring.add_done_callback(self._declaring.discard)

    def hold_final_state(self, step: int, outer_hash: str, *, stop_event: threading.Event) -> bool:
        """At the end of our run: declare that it ended at outer step `step` and serve that state until
        every live trainer of the run has declared `step` or later (a member that the last round left
        out of sync takes it from us), for at most the averaging timeout. Whether they all got there."""
        self.publish_step(step)
        self.runtime.call(
            self.rounds.declare(step, outer_hash, time.time(), serves_state=not self._doubtful, final=True),
            timeout_s=60.0,
        )
        deadline = time.monotonic() + self.config.averaging_timeout_s
        while not stop_event.is_set():
            if all(peer_step >= step for peer_step in self.peer_steps().values()):
                return True
            if time.monotonic() >= deadline:
                return False
            stop_event.wait(_PEER_POLL_S)
        return False

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        if self._closed:
            return DoneAverage(RoundOutcome(None, 1))
        future = self.runtime.submit(self._average(step, list(pseudo_grads), outer_hash))
        return _Pending(future, self.label, self.rounds.codec)

    async def _average(self, step: int, tensors: list[torch.Tensor], outer_hash: str) -> RoundOutcome:
        if self.rounds.declared_step != step:  # a round not prepared is declared now
            await self.rounds.declare(step, outer_hash, time.time(), serves_state=not self._doubtful)
        outcome = await self.rounds.average(step, tensors, outer_hash)
        if outcome.averaged is None:
            # Averaged alone, the trainer applies its whole pseudo-gradient: the error feedback of
            # what the codec did not send would be applied a second time by the next round.
            self.rounds.codec.reset()
        if not outcome.in_sync:
            self._doubtful = True
            self.states.set_state(None)
        return outcome

    def bytes_sent(self) -> int:
        return self.rounds.bytes_sent + self.states.bytes_sent

    # ---- steps and state -----------------------------------------------------------------------

    def _declarations(self) -> dict[bytes, RoundDeclaration]:
        now = time.monotonic()
        if now - self._declared_at > _DECLARATIONS_CACHE_S:
            self._declared = self.runtime.call(self.rounds.declarations(), timeout_s=60.0)
            self._declared_at = now
        return self._declared

    def peer_steps(self) -> dict[bytes, float]:
        """Outer steps live trainers of the run declare (self excluded; self-reported, untrusted)."""
        self._declared_at = -float("inf")
        return {p: float(d.step) for p, d in self._declarations().items()}

    def has_peers(self) -> bool:
        return bool(self._declarations())

    def set_state_provider(self, provider: Callable[[], OuterState]) -> None:
        self._provider = provider

    def publish_step(self, step: int) -> None:
        """Serve our state as of outer step `step` (unless our last round left us out of sync)."""
        if self._provider is not None and not self._doubtful:
            self.states.set_state(self._provider())

    def witness_rule(self) -> Callable[[bytes], bool]:
        """Whether a peer's agreement on a state counts, as of the declarations read last (see module
        docstring). Built on the caller's thread: the rule runs on the event loop, which must not wait."""
        named = self.trusted | (self.admitted or frozenset())
        live = live_standing(self._declarations(), self.rounds.standing)
        return lambda peer: peer in named or not live or peer in live

    def fetch_state(
        self,
        *,
        newer_than: int,
        timeout_s: float = 60.0,
        wait_s: float | None = None,
        stop_event: threading.Event | None = None,
    ) -> OuterState | None:
        """A state past outer step `newer_than` that the run vouches for, or None after `wait_s`
        (or as soon as `stop_event` is set: a download in flight is cancelled)."""
        stop = stop_event if stop_event is not None else threading.Event()
        deadline = time.monotonic() + (self.config.averaging_timeout_s if wait_s is None else wait_s)
        progress = self.states.new_progress()
        while not stop.is_set():
            self._declared_at = -float("inf")
            candidates = self._state_sources(newer_than)
            witness = self.witness_rule()
            if candidates:
                fetching = self.runtime.submit(
                    self.states.fetch(
                        [PeerID(p) for p in candidates],
                        newer_than=newer_than,
                        trusted=self.trusted | self._sole_partner(),
                        counts_as_witness=witness,
                        timeout_s=timeout_s,
                        progress=progress,
                    ),
                )
                result = _unless_stopped(fetching, stop)
                if result is None:
                    break
                if result.state is not None:
                    self._doubtful = False
                    self.rounds.codec.reset()  # the error feedback was of our own, abandoned trajectory
                    self.states.set_state(result.state)
                    return result.state
            if time.monotonic() >= deadline:
                refused = "; ".join(
                    f"{source.to_base58()[-8:]} at outer step {step} (hash {digest})"
                    for (step, digest), (source, _) in progress.held.items()
                )
                logger.warning(
                    "%s: no state past outer step %d that the run vouches for; keeping our own%s",
                    self.label,
                    newer_than,
                    f" (refused, as nobody confirmed them: {refused})" if refused else "",
                )
                return None
            stop.wait(_PEER_POLL_S)
        logger.info("%s: stopped while looking for the run's state; keeping our own", self.label)
        return None

    def _sole_partner(self) -> frozenset[bytes]:
        """The live trainer we have averaged in sync with, if it is the only one (see module docstring)."""
        partners = self.rounds.standing.intersection(self._declarations())
        return frozenset(partners) if len(partners) == 1 else frozenset()

    def _state_sources(self, newer_than: int) -> list[bytes]:
        return state_sources(self._declarations(), newer_than, self.rounds.standing)

    # ---- lifecycle ---------------------------------------------------------------------------

    def cancel_round(self) -> None:
        """Nothing to cancel: a round in flight ends by its own deadlines."""

    def is_alive(self) -> bool:
        return not self._closed

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for declaring in list(self._declaring):  # a declaration in flight is moot now
            declaring.cancel()
        self.runtime.stop_service(self.states)
        self.runtime.stop_service(self.rounds)
        with contextlib.suppress(Exception):
            self.runtime.call(self.p2p.shutdown(), timeout_s=10.0)
        if self._own_runtime:
            self.runtime.close()
