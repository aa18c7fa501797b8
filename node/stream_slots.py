"""Admission of a stream service's streams: a total cap, a per-peer cap and fair-share preemption.

Shared by the weight broadcast's manifest and chunk service (`node.broadcast.service`) and the
rollout transport's stream services (`node.rollouts.streams`). Caps alone let a few free
identities lock everyone else out: with a total cap T and a per-peer cap P, T/P PeerIDs each
holding P silent streams leave any newcomer with "busy" until they hang up. So a full budget
does not refuse a newcomer outright: if some peer holds at least two streams more than the
newcomer, one of that peer's streams is preempted and the newcomer takes its slot.

Rules (`StreamSlots.admit`):

- a peer at its own cap (`max_per_peer`) gives up its own stream idle the longest: a client
  that hung up opens its next stream before the service has seen the last one close, so
  refusing would fail an honest client's sequential requests at random. It is refused only
  while every stream it holds is writing a response;
- under the total cap every stream is admitted;
- at the total cap, the peer holding the most streams (if it holds at least two more than the
  newcomer) loses one: preferably one that is not in the middle of a response, the one idle the
  longest; otherwise its newest, which then ends as soon as its current response is written.
  "Two more", not "one more": two peers a stream apart would otherwise trade that stream back
  and forth, and a peer holding a single stream can never be preempted, so an honest fetcher
  keeps the stream it has. A few identities can thus hold at most their fair share of the
  budget whenever others want streams; only as many identities as there are slots could still
  fill it (and each then holds one).

A preempted stream is not misbehaviour: the service tells its peer it is busy (retryable, no ban)
and closes it. A response already being written is never cut short (a truncated payload would
look like a protocol violation to an honest client): the service marks that part with
`StreamSlot.responding()`, and preemption waits for its end. The slot itself passes to the
newcomer at once, so a stream finishing its last response no longer counts against the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StreamPreempted", "StreamSlot", "StreamSlots"]


class StreamPreempted(Exception):
    """Raised inside a stream's serving when a response ends and the stream was preempted meanwhile."""


@dataclass(eq=False)
class StreamSlot:
    """One admitted stream of `peer`; `preempted` once another peer's stream took its place."""

    peer: bytes
    admitted_at: float
    idle_since: float
    clock: Callable[[], float] = field(repr=False)
    preempted: bool = False
    responding_now: int = 0
    """How many responses of this stream are being written (preemption waits while above zero)."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @contextlib.contextmanager
    def responding(self) -> Iterator[None]:
        """Around writing one response: preemption does not interrupt it, and takes effect at its end
        (`StreamPreempted` is raised then); the stream is idle again afterwards."""
        self.responding_now += 1
        try:
            yield
        finally:
            self.responding_now -= 1
            self.idle_since = self.clock()
        if self.preempted and self.responding_now == 0:
            raise StreamPreempted("another peer's stream took this stream's slot")


class StreamSlots:
    """The streams a service serves at once: at most `max_total`, at most `max_per_peer` per peer."""

    def __init__(
        self, max_total: int, max_per_peer: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_total < 1 or max_per_peer < 1:
            raise ValueError("stream caps must be at least 1")
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._clock = clock
        self._by_peer: dict[bytes, list[StreamSlot]] = {}
        """Each peer's admitted streams, oldest first (peers with none are not kept)."""
        self.total = 0
        self.preemptions = 0
        """Streams closed to make room for another peer's."""

    def of(self, peer: bytes) -> int:
        """Streams admitted for `peer` (PeerID bytes)."""
        return len(self._by_peer.get(peer, ()))

    @property
    def peers(self) -> int:
        """Peers with at least one admitted stream."""
        return len(self._by_peer)

    def admit(self, peer: bytes) -> StreamSlot | str:
        """A slot for a new stream of `peer`, preempting another peer's stream if the budget is full
        (see the module's rules); or, if refused, why (a short text for the peer)."""
        own = self.of(peer)
        if own >= self.max_per_peer:
            idle = [s for s in self._by_peer[peer] if s.responding_now == 0]
            if not idle:
                return f"at most {self.max_per_peer} streams per peer"
            self.preempt(min(idle, key=lambda s: s.idle_since))
            own -= 1
        if self.total >= self.max_total:
            victim = self._victim(own)
            if victim is None:
                return "too many streams, try again later"
            self.preempt(victim)
        now = self._clock()
        slot = StreamSlot(peer=peer, admitted_at=now, idle_since=now, clock=self._clock)
        self._by_peer.setdefault(peer, []).append(slot)
        self.total += 1
        return slot

    def release(self, slot: StreamSlot) -> None:
        """Free `slot` (a no-op if it was preempted or released already)."""
        own = self._by_peer.get(slot.peer)
        if own is None or slot not in own:
            return
        own.remove(slot)
        self.total -= 1
        if not own:
            del self._by_peer[slot.peer]

    def preempt(self, slot: StreamSlot) -> None:
        """Take `slot` away from its stream: freed at once; its serving is cancelled now if it is between
        responses, else when its current response is written."""
        self.release(slot)
        slot.preempted = True
        self.preemptions += 1
        if slot.responding_now == 0 and slot.task is not None:
            slot.task.cancel()

    def _victim(self, newcomer_holds: int) -> StreamSlot | None:
        """The stream to preempt for a newcomer holding `newcomer_holds` streams, or None if no peer
        holds at least two more than it."""
        if not self._by_peer:
            return None
        most = max(len(slots) for slots in self._by_peer.values())
        if most < newcomer_holds + 2:
            return None
        candidates = [s for slots in self._by_peer.values() if len(slots) == most for s in slots]
        idle = [s for s in candidates if s.responding_now == 0]
        if idle:
            return min(idle, key=lambda s: s.idle_since)
        return max(candidates, key=lambda s: s.admitted_at)

    async def serve(self, slot: StreamSlot, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` (the serving of `slot`'s stream) until it ends, then free the slot. True if it ended
        by itself; False if the slot was preempted (the caller then tells the peer it is busy).
        Exceptions of `work` propagate."""
        if slot.preempted:
            work.close()
            return False
        task = asyncio.ensure_future(work)
        slot.task = task
        try:
            await asyncio.wait({task})
        finally:
            if not task.done():  # the caller itself was cancelled
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.release(slot)
        if slot.preempted and (task.cancelled() or isinstance(task.exception(), StreamPreempted)):
            return False
        task.result()
        return True
