"""What a running fetch reports for progress bars: bytes and chunks done, rate, active sources, ETA.

`FetchProgress` is the snapshot handed to a fetch's `progress` callback; `ProgressMeter` keeps
the recent deliveries a `node.broadcast.fetch.VersionFetch` needs to compute it (the rate is
the bytes delivered over the last `window_s` seconds).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FetchProgress", "ProgressMeter"]


@dataclass
class FetchProgress:
    """A snapshot of a running fetch, for progress bars."""

    bytes_done: int
    total_bytes: int
    chunks_done: int
    num_chunks: int
    rate_bytes_per_s: float
    sources: int
    """Sources that delivered a chunk in the last few seconds."""
    eta_s: float | None


class ProgressMeter:
    """Chunk deliveries of the last `window_s` seconds, turned into `FetchProgress` snapshots."""

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        self._deliveries: list[tuple[float, int]] = []

    def delivered(self, num_bytes: int) -> None:
        """A verified chunk of `num_bytes` arrived now."""
        self._deliveries.append((time.monotonic(), num_bytes))

    def snapshot(
        self,
        *,
        chunks_done: int,
        num_chunks: int,
        chunk_bytes: int,
        total_bytes: int,
        last_deliveries: Iterable[float],
    ) -> FetchProgress:
        """The progress now; `last_deliveries` holds each source's last delivery (monotonic time)."""
        now = time.monotonic()
        self._deliveries = [(t, n) for t, n in self._deliveries if t > now - self.window_s]
        rate = sum(n for _, n in self._deliveries) / self.window_s
        done = min(chunks_done * chunk_bytes, total_bytes)
        return FetchProgress(
            bytes_done=done,
            total_bytes=total_bytes,
            chunks_done=chunks_done,
            num_chunks=num_chunks,
            rate_bytes_per_s=rate,
            sources=sum(1 for t in last_deliveries if t > now - self.window_s),
            eta_s=(total_bytes - done) / rate if rate > 0 else None,
        )
