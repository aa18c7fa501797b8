"""The open streams of a stream service, counted in total and per peer, so that both can be capped.

Shared by the weight broadcast's chunk service (`node.broadcast.service`) and the rollout
transport's stream services (`node.rollouts.streams`): each checks the counts against its own
caps before admitting a stream, then holds a slot for as long as it serves it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

__all__ = ["StreamSlots"]


class StreamSlots:
    """How many streams are open, and how many of them per peer (peers with none are not kept)."""

    def __init__(self) -> None:
        self.total = 0
        self._per_peer: Counter[bytes] = Counter()

    def of(self, peer: bytes) -> int:
        """Streams open with `peer` (PeerID bytes)."""
        return self._per_peer.get(peer, 0)

    @property
    def peers(self) -> int:
        """Peers with at least one open stream."""
        return len(self._per_peer)

    @contextlib.contextmanager
    def held(self, peer: bytes) -> Iterator[None]:
        """Count one more stream with `peer` until the block ends, however it ends."""
        self.total += 1
        self._per_peer[peer] += 1
        try:
            yield
        finally:
            self.total -= 1
            self._per_peer[peer] -= 1
            if self._per_peer[peer] <= 0:
                del self._per_peer[peer]
