"""Per-peer token buckets: how many requests of a kind each peer may make per window.

Peers that are full again are forgotten once many are tracked, so that any number of identities
cannot grow the table without bound.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MAX_TRACKED_PEERS", "PeerBudget"]

MAX_TRACKED_PEERS = 1024
"""Above this many tracked peers, the full buckets are dropped (amortised)."""


class PeerBudget:
    """A token bucket per peer: `capacity` tokens, refilled over `window_s`."""

    def __init__(self, capacity: int, window_s: float, clock: Callable[[], float]) -> None:
        self.capacity, self.rate, self.clock = capacity, capacity / window_s, clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # peer -> (tokens, as of)
        self._prune_above = MAX_TRACKED_PEERS

    def _tokens(self, peer: bytes, now: float) -> float:
        tokens, since = self._buckets.get(peer, (self.capacity, now))
        return min(float(self.capacity), tokens + (now - since) * self.rate)

    def take(self, peer: bytes) -> float:
        """0.0 if a token was taken; else the seconds until one will be available."""
        now = self.clock()
        tokens = self._tokens(peer, now)
        if tokens < 1.0:
            return (1.0 - tokens) / self.rate
        self._buckets[peer] = (tokens - 1.0, now)
        if len(self._buckets) > self._prune_above:  # amortised: many identities must not grow it unbounded
            full = [p for p in self._buckets if self._tokens(p, now) >= self.capacity]
            for p in full:
                del self._buckets[p]
            self._prune_above = max(MAX_TRACKED_PEERS, 2 * len(self._buckets))
        return 0.0

    def exhausted(self, peer: bytes) -> bool:
        """Whether `peer` has no token left now."""
        return self._tokens(peer, self.clock()) < 1.0

    def refund(self, peer: bytes) -> None:
        now = self.clock()
        self._buckets[peer] = (min(float(self.capacity), self._tokens(peer, now) + 1.0), now)
