"""Admission of bitmap watch streams: a budget of their own, a per-peer cap and eviction.

A watch stream is meant to stay open for as long as its client fetches a version, so unlike a
chunk request it holds its slot while idle. Watches therefore never count against the upload
streams (chunk and manifest requests are never refused because watches are held), and a full
watch budget does not lock newcomers out: a newcomer takes the oldest watch of the peer that
holds the most, provided that peer holds more than the newcomer. A peer at its own cap replaces
its own oldest watch. A few identities can thus hold at most their share of the budget, and an
honest fetcher holding one watch is the last to be evicted. Each watch also has a lifetime
(`watch_lifetime_s`, enforced by the service); fetchers simply open a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class WatchSlot:
    """One admitted watch stream; `evicted` once another stream took its place (its writer is closed)."""

    peer: bytes
    writer: asyncio.StreamWriter
    opened_at: float = field(default_factory=time.monotonic)
    evicted: bool = False


class WatchSlots:
    """The watch streams a node serves at once: at most `max_total`, at most `max_per_peer` per peer."""

    def __init__(self, max_total: int, max_per_peer: int) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._by_peer: dict[bytes, list[WatchSlot]] = {}
        """Each peer's live watches, oldest first."""
        self._count = 0
        self.evictions = 0
        self.expired = 0
        """Watches closed by the service at the end of their lifetime."""

    def __len__(self) -> int:
        return self._count

    def held_by(self, peer: bytes) -> int:
        return len(self._by_peer.get(peer, ()))

    def admit(self, peer: bytes, writer: asyncio.StreamWriter) -> WatchSlot | None:
        """A slot for a new watch stream from `peer`, evicting another if needed; None if refused."""
        own = self._by_peer.get(peer, [])
        if len(own) >= self.max_per_peer:
            self._evict(own[0])
        elif self._count >= self.max_total:
            victim = self._heaviest_oldest()
            if victim is None or self.held_by(victim.peer) <= len(own):
                return None
            self._evict(victim)
        slot = WatchSlot(peer=peer, writer=writer)
        self._by_peer.setdefault(peer, []).append(slot)
        self._count += 1
        return slot

    def release(self, slot: WatchSlot) -> None:
        """Free `slot` (a no-op if it was evicted)."""
        own = self._by_peer.get(slot.peer)
        if own is None or slot not in own:
            return
        own.remove(slot)
        self._count -= 1
        if not own:
            del self._by_peer[slot.peer]

    def _heaviest_oldest(self) -> WatchSlot | None:
        """The oldest watch of the peer holding the most (ties: the peer whose oldest is older)."""
        if not self._by_peer:
            return None
        peer = max(self._by_peer, key=lambda p: (len(self._by_peer[p]), -self._by_peer[p][0].opened_at))
        return self._by_peer[peer][0]

    def _evict(self, slot: WatchSlot) -> None:
        self.release(slot)
        slot.evicted = True
        self.evictions += 1
        with contextlib.suppress(Exception):
            slot.writer.close()  # the serving loop sees its stream end and returns
