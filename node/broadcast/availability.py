"""Which sources hold, or say they are fetching, each chunk of the version being fetched.

The fetch scheduler's (`node.broadcast.fetch`) view of one version across its sources: each
source's chunk bitmap, kept exact by its watch stream, and its recent "fetching" hints (bounded,
oldest forgotten first), counted per chunk so that the rarest chunks are asked for first. A
source that is dropped takes its counts with it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hivemind.p2p import PeerID

from node.broadcast.records import HolderInfo
from node.broadcast.requests import Stream
from protocol.chunk_bitmap import bitmap_get

MAX_FETCHING_HINTS = 64
"""Chunks a source may have hinted it is fetching at once (older hints are forgotten)."""


@dataclass
class Source:
    """One peer the fetch downloads from: what it holds, what it is fetching, our requests to it."""

    info: HolderInfo
    bitmap: bytearray | None = None
    inflight: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    idle_streams: list[Stream] = field(default_factory=list)
    rate_bytes_per_s: float | None = None
    last_delivery: float = 0.0
    watch_task: asyncio.Task[None] | None = None
    fetching: dict[int, None] = field(default_factory=dict)
    """Chunks the source said it is fetching (a hint, oldest first, bounded)."""

    @property
    def peer_id(self) -> PeerID:
        return self.info.peer_id


class Availability:
    """Per chunk: how many sources hold it (`holders`) and how many hinted they are fetching it (`fetching`)."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self.holders = [0] * num_chunks
        self.fetching = [0] * num_chunks
        """How many sources hinted that they are fetching each chunk (it will soon be less rare)."""

    def rarity(self, index: int) -> int:
        """Sources that hold or are fetching chunk `index` (fewer is rarer)."""
        return self.holders[index] + self.fetching[index]

    def mark_fetching(self, source: Source, index: int) -> None:
        if index in source.fetching or (source.bitmap is not None and bitmap_get(source.bitmap, index)):
            return
        if len(source.fetching) >= MAX_FETCHING_HINTS:
            oldest = next(iter(source.fetching))
            del source.fetching[oldest]
            self.fetching[oldest] -= 1
        source.fetching[index] = None
        self.fetching[index] += 1

    def mark_has(self, source: Source, index: int) -> None:
        if source.bitmap is None:
            raise ValueError("a source's chunks are marked only once its first bitmap arrived")
        if index in source.fetching:
            del source.fetching[index]
            self.fetching[index] -= 1
        if not bitmap_get(source.bitmap, index):
            source.bitmap[index >> 3] |= 1 << (index & 7)
            self.holders[index] += 1

    def mark_lacks(self, source: Source, index: int) -> None:
        if source.bitmap is not None and bitmap_get(source.bitmap, index):
            source.bitmap[index >> 3] &= ~(1 << (index & 7)) & 0xFF
            self.holders[index] -= 1

    def forget(self, source: Source) -> None:
        """Take back everything `source` counted for (it was dropped)."""
        if source.bitmap is not None:
            for index in range(self.num_chunks):
                if bitmap_get(source.bitmap, index):
                    self.holders[index] -= 1
        for index in source.fetching:
            self.fetching[index] -= 1
        source.fetching.clear()
