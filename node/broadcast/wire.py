"""Framing of weight-broadcast streams, with a size cap checked before anything is buffered.

Every frame is a 4-byte big-endian length followed by that many bytes. A reader is always
told the largest frame it may accept and refuses a longer one after reading only the
length; raw payloads (manifests, chunks) follow a response header whose declared size the
reader checks against the exact size it expects before reading. `RateLimiter` is the
application-level upload cap (a token bucket) used by the serving path.
"""

from __future__ import annotations

import asyncio
import time

from protocol.errors import InvalidMessage

_LENGTH_BYTES = 4
WRITE_SLICE_BYTES = 64 * 1024
"""Payloads are written (and rate-limited) in slices of this size."""


class TruncatedFrame(InvalidMessage):
    """The stream ended inside a frame: what a peer that died or lost its connection mid-send leaves."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """Read one frame of at most `max_bytes`; None on a clean end of stream before a frame starts."""
    try:
        header = await reader.readexactly(_LENGTH_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise TruncatedFrame("stream ended inside a frame header") from None
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise InvalidMessage(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise TruncatedFrame("stream ended inside a frame") from None


async def read_payload(reader: asyncio.StreamReader, declared_bytes: int, expected_bytes: int) -> bytes:
    """Read a raw payload whose header declared `declared_bytes`, refusing any size but `expected_bytes`."""
    if declared_bytes != expected_bytes:
        raise InvalidMessage(
            f"peer declared a {declared_bytes}-byte payload where {expected_bytes} are expected"
        )
    try:
        return await reader.readexactly(expected_bytes)
    except asyncio.IncompleteReadError:
        raise InvalidMessage("stream ended inside a payload") from None


def encode_frame(data: bytes) -> bytes:
    """One frame holding `data`."""
    return len(data).to_bytes(_LENGTH_BYTES, "big") + data


async def write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write one frame and wait until it is handed to the transport."""
    writer.write(encode_frame(data))
    await writer.drain()


RATE_RECHECK_S = 0.25
"""Longest sleep of an upload waiting for the cap before it looks at the cap again."""


class RateLimiter:
    """A token bucket shared by every upload of a node; `bytes_per_s=None` means no cap."""

    def __init__(self, bytes_per_s: float | None, burst_bytes: int = 256 * 1024) -> None:
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def consume(self, num_bytes: int) -> None:
        """Wait until `num_bytes` may be sent."""
        if self.bytes_per_s is None:
            return
        async with self._lock:  # FIFO: uploads share the rate fairly
            while True:
                rate = self.bytes_per_s  # lifted (None) while this upload waited: no cap any more
                if rate is None:
                    return
                now = time.monotonic()
                self._tokens = min(self.burst_bytes, self._tokens + (now - self._updated) * rate)
                self._updated = now
                if self._tokens >= num_bytes or self._tokens >= self.burst_bytes:
                    self._tokens -= num_bytes
                    return
                # a wait is re-checked often: a new rate (or no cap) applies to the uploads already waiting
                await asyncio.sleep(min(RATE_RECHECK_S, (num_bytes - self._tokens) / rate))


async def write_payload(
    writer: asyncio.StreamWriter,
    data: bytes | memoryview,
    limiter: RateLimiter,
    *,
    drain_budget_s: float | None = None,
) -> None:
    """Write a raw payload in slices, each one paid for with the upload cap.

    With `drain_budget_s`, the peer must take the whole payload within that many seconds of waiting
    on the transport (waiting for the upload cap is not counted), else TimeoutError: a slow reader.
    """
    view = memoryview(data)
    budget = drain_budget_s
    for offset in range(0, len(view), WRITE_SLICE_BYTES):
        piece = view[offset : offset + WRITE_SLICE_BYTES]
        await limiter.consume(len(piece))
        writer.write(piece)
        if budget is None:
            await writer.drain()
            continue
        if budget <= 0:
            raise TimeoutError("the peer does not take the payload")
        started = time.monotonic()
        await asyncio.wait_for(writer.drain(), timeout=budget)
        budget -= time.monotonic() - started
