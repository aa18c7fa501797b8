"""The serving side of the weight broadcast: manifests, chunks and live chunk bitmaps over libp2p streams.

Three stream protocols, each a sequence of length-prefixed frames (see `node.broadcast.wire`):

- `PROTO_MANIFEST`: ManifestRequest -> ResponseHeader + the raw signed manifest.
- `PROTO_CHUNK`: ChunkRequest -> ResponseHeader + the raw chunk, repeated on one stream.
- `PROTO_WATCH`: WatchRequest -> ResponseHeader, then HaveUpdate frames: first the full
  bitmap, then the indices of chunks as this node gets them (and hints of the chunks it has
  just requested), until the client hangs up.

Only chunks already verified and on disk are ever served. Requests are capped at
`MAX_BROADCAST_REQUEST_BYTES` before buffering and must arrive within `stream_idle_timeout_s`;
a peer that sends an oversized or malformed request is banned. Every response must be taken by
the peer within `write_timeout_s` (time waiting for the upload cap not counted), so a slow
reader cannot hold a stream or an upload slot. At most `upload_slots` chunks are uploaded at
once (the rest wait in FIFO order), and uploads pass through one token bucket
(`upload_bytes_per_s`). Manifest and chunk streams share one budget (`max_upload_streams`, per
peer too) with fair-share preemption (`node.stream_slots`): when it is full, a newcomer takes a
stream of the peer holding the most, which is told `STATUS_BUSY` ("preempted") between two
responses, never in the middle of one. Watch streams, which stay open while idle, have their
own budget (`node.broadcast.watch_slots`) and end after `watch_lifetime_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from google.protobuf.message import Message
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from node.bans import BanList
from node.broadcast.config import BroadcastConfig
from node.broadcast.store import VersionEntry
from node.broadcast.watch_slots import WatchSlot, WatchSlots
from node.broadcast.wire import RateLimiter, read_frame, write_frame, write_payload
from node.metrics import NO_TRANSFER_METRICS, TransferMetrics
from node.stream_slots import StreamSlot, StreamSlots
from protocol import broadcast_pb2 as bpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_BROADCAST_REQUEST_BYTES, MAX_HAVE_BATCH
from protocol.untrusted import parse_untrusted
from protocol.version import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

PROTO_MANIFEST = f"/hivenet/{PROTOCOL_VERSION}/weights/manifest"
PROTO_CHUNK = f"/hivenet/{PROTOCOL_VERSION}/weights/chunk"
PROTO_WATCH = f"/hivenet/{PROTOCOL_VERSION}/weights/watch"

_Handler = Callable[
    [PeerID, asyncio.StreamReader, asyncio.StreamWriter, StreamSlot], Coroutine[Any, Any, None]
]
_WatchHandler = Callable[[PeerID, asyncio.StreamReader, asyncio.StreamWriter, WatchSlot], Awaitable[None]]
PREEMPTED_DETAIL = "busy: preempted, this node serves too many streams; try again later"
"""The detail of the STATUS_BUSY a stream is closed with when another peer's stream takes its slot."""
_DROPPED = -1
_FETCHING = 1 << 62
"""Added to a chunk index in a watcher's queue: 'this node has requested that chunk' (a hint)."""


def parse_request(data: bytes, message_type: type[M]) -> M:
    """Parse an untrusted (already size-capped) request frame; InvalidMessage if malformed."""
    return parse_untrusted(message_type, data, message_type.__name__)


async def send_header(
    writer: asyncio.StreamWriter, status: int, payload_bytes: int = 0, detail: str = ""
) -> None:
    await write_frame(
        writer,
        bpb.ResponseHeader(status=status, payload_bytes=payload_bytes, detail=detail).SerializeToString(),  # type: ignore[arg-type]
    )


class BroadcastService:
    """Serves the versions offered to it to any peer that is not banned."""

    def __init__(
        self,
        *,
        p2p: P2P,
        config: BroadcastConfig,
        bans: BanList,
        owner: str = "",
        metrics: TransferMetrics = NO_TRANSFER_METRICS,
    ) -> None:
        self.p2p = p2p
        self.metrics = metrics
        self.config = config
        self.bans = bans
        self.owner = owner
        self.limiter = RateLimiter(config.upload_bytes_per_s)
        self._upload_slots = asyncio.Semaphore(config.upload_slots)
        self.uploaded_bytes = 0
        """Payload bytes sent to other peers (chunks and manifests)."""
        self._entries: dict[tuple[str, int], VersionEntry] = {}
        self._last_served: dict[tuple[str, int], float] = {}
        self._watchers: dict[tuple[str, int], set[asyncio.Queue[int]]] = {}
        self.uploads = StreamSlots(config.max_upload_streams, config.max_upload_streams_per_peer)
        """The manifest and chunk streams being served (counts, preemptions)."""
        self.watches = WatchSlots(config.max_watch_streams, config.max_watch_streams_per_peer)
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    async def start(self) -> None:
        if not self.config.serve:
            return
        for proto, handler in (
            (PROTO_MANIFEST, self.rpc_manifest),
            (PROTO_CHUNK, self.rpc_chunk),
        ):
            await self.p2p.add_binary_stream_handler(proto, self._guarded(handler))
        await self.p2p.add_binary_stream_handler(PROTO_WATCH, self._guarded_watch(self.rpc_watch))
        self._started = True

    async def stop(self) -> None:
        if self._started:
            for proto in (PROTO_MANIFEST, PROTO_CHUNK, PROTO_WATCH):
                with contextlib.suppress(Exception):
                    await self.p2p.remove_binary_stream_handler(proto)
            self._started = False
        for key in list(self._watchers):
            self._notify(key, _DROPPED)

    def offer(self, entry: VersionEntry) -> None:
        """Serve `entry` (whatever chunks it holds, now and as they arrive)."""
        self._entries[(entry.run_id, entry.version)] = entry

    def withdraw(self, run_id: str, version: int) -> None:
        """Stop serving a version; watchers are told it was dropped."""
        self._entries.pop((run_id, version), None)
        self._last_served.pop((run_id, version), None)
        self._notify((run_id, version), _DROPPED)

    def offered(self) -> list[VersionEntry]:
        return list(self._entries.values())

    def chunk_added(self, entry: VersionEntry, index: int) -> None:
        """Tell every watcher of `entry` that chunk `index` is now held (call after it is written)."""
        self._notify((entry.run_id, entry.version), index)

    def chunk_requested(self, entry: VersionEntry, index: int) -> None:
        """Hint every watcher of `entry` that this node is fetching chunk `index`, so they fetch others."""
        self._notify((entry.run_id, entry.version), _FETCHING + index)

    def _notify(self, key: tuple[str, int], index: int) -> None:
        for queue in self._watchers.get(key, ()):
            queue.put_nowait(index)

    def _lookup(self, run_id: str, version: int, content_id: bytes) -> VersionEntry | None:
        entry = self._entries.get((run_id, version))
        if entry is None or entry.closed or entry.manifest.content_id != content_id:
            return None
        self._last_served[(run_id, version)] = time.monotonic()
        return entry

    def recently_served(self, run_id: str, within_s: float) -> list[int]:
        """Versions of `run_id` whose manifest, chunks or bitmap a peer asked for in the last `within_s`
        seconds (or is watching now), newest first."""
        now = time.monotonic()
        watched = {version for (run, version) in self._watchers if run == run_id}
        recent = {
            version
            for (run, version), at in self._last_served.items()
            if run == run_id and now - at <= within_s
        }
        return sorted(watched | recent, reverse=True)

    def _guarded(
        self, handler: _Handler
    ) -> Callable[[StreamInfo, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        """A manifest or chunk handler behind the upload-stream budget (which may preempt another
        peer's stream to admit this one)."""

        async def serve(info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = info.peer_id
            key = peer.to_bytes()
            with self._stream_errors(peer, writer):
                if self.bans.is_banned(peer):
                    return
                slot = self.uploads.admit(key)
                if isinstance(slot, str):
                    await self._send_header(writer, bpb.STATUS_BUSY, detail=f"busy: {slot}")
                    return
                if not await self.uploads.serve(slot, handler(peer, reader, writer, slot)):
                    await self._send_header(writer, bpb.STATUS_BUSY, detail=PREEMPTED_DETAIL)

        return serve

    def _guarded_watch(
        self, handler: _WatchHandler
    ) -> Callable[[StreamInfo, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        """A watch handler behind the watch budget (which may evict an older watch to admit this one)."""

        async def serve(info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = info.peer_id
            with self._stream_errors(peer, writer):
                if self.bans.is_banned(peer):
                    return
                slot = self.watches.admit(peer.to_bytes(), writer)
                if slot is None:
                    await self._send_header(writer, bpb.STATUS_BUSY, detail="too many watches")
                    return
                try:
                    await handler(peer, reader, writer, slot)
                finally:
                    self.watches.release(slot)

        return serve

    async def _send_header(
        self, writer: asyncio.StreamWriter, status: int, payload_bytes: int = 0, detail: str = ""
    ) -> None:
        """`send_header`, failing with TimeoutError if the peer does not take it within `write_timeout_s`."""
        await asyncio.wait_for(
            send_header(writer, status, payload_bytes, detail), timeout=self.config.write_timeout_s
        )

    async def _send_frame(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        await asyncio.wait_for(write_frame(writer, data), timeout=self.config.write_timeout_s)

    async def _send_payload(self, writer: asyncio.StreamWriter, data: bytes | memoryview) -> None:
        await write_payload(writer, data, self.limiter, drain_budget_s=self.config.write_timeout_s)

    @contextlib.contextmanager
    def _stream_errors(self, peer: PeerID, writer: asyncio.StreamWriter) -> Iterator[None]:
        """Around one served stream: a bad request bans the peer, nothing else escapes, the stream is closed."""
        try:
            yield
        except InvalidMessage as exc:
            self.bans.ban(peer, f"bad request: {exc}")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        except Exception as exc:  # one bad stream must never take the node down
            logger.info("[%s] serving stream from %s failed: %r", self.owner, peer.to_base58()[-8:], exc)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        return await asyncio.wait_for(
            read_frame(reader, MAX_BROADCAST_REQUEST_BYTES), timeout=self.config.stream_idle_timeout_s
        )

    async def rpc_manifest(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: StreamSlot
    ) -> None:
        """Send the signed manifest of a version this node holds."""
        while (frame := await self._read_request(reader)) is not None:
            request = parse_request(frame, bpb.ManifestRequest)
            entry = self._lookup(request.run_id, request.version, request.content_id)
            with slot.responding():
                if entry is None:
                    await self._send_header(writer, bpb.STATUS_NOT_FOUND)
                    continue
                raw = entry.manifest.raw
                await self._send_header(writer, bpb.STATUS_OK, len(raw))
                await self._send_payload(writer, raw)
                self.uploaded_bytes += len(raw)
                self.metrics.manifest_served(len(raw))

    async def rpc_chunk(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: StreamSlot
    ) -> None:
        """Send held chunks, one per request, for as long as the client keeps the stream open."""
        while (frame := await self._read_request(reader)) is not None:
            request = parse_request(frame, bpb.ChunkRequest)
            entry = self._lookup(request.run_id, request.version, request.content_id)
            if entry is None or not entry.has(request.index):
                with slot.responding():
                    await self._send_header(writer, bpb.STATUS_NOT_FOUND)
                continue
            # waiting here is not responding yet: a preempted stream is told it is busy instead
            async with self._upload_slots:  # FIFO: whole chunks leave one after another at full rate
                with slot.responding():
                    try:
                        data = entry.read_chunk(request.index)
                    except Exception:  # pruned meanwhile
                        await self._send_header(writer, bpb.STATUS_NOT_FOUND)
                        continue
                    await self._send_header(writer, bpb.STATUS_OK, len(data))
                    await self._send_payload(writer, data)
                    self.uploaded_bytes += len(data)
                    self.metrics.chunk_served(len(data))

    async def rpc_watch(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: WatchSlot
    ) -> None:
        """Send the full bitmap of a version, then each newly held chunk, until the client hangs up,
        the watch's lifetime ends or another watch takes its slot."""
        deadline = slot.opened_at + self.config.watch_lifetime_s
        frame = await self._read_request(reader)
        if frame is None:
            return
        request = parse_request(frame, bpb.WatchRequest)
        entry = self._lookup(request.run_id, request.version, request.content_id)
        if entry is None:
            await self._send_header(writer, bpb.STATUS_NOT_FOUND)
            return
        key = (entry.run_id, entry.version)
        queue: asyncio.Queue[int] = asyncio.Queue()
        self._watchers.setdefault(key, set()).add(queue)
        hangup = asyncio.ensure_future(
            reader.read(1)
        )  # the client sends nothing more: any read ends the watch
        try:
            await self._send_header(writer, bpb.STATUS_OK)
            await self._send_frame(writer, bpb.HaveUpdate(bitmap=bytes(entry.bitmap)).SerializeToString())
            while not slot.evicted:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, hangup},
                    timeout=max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter not in done:
                    getter.cancel()
                    if not done:
                        self.watches.expired += 1
                    return
                batch = [getter.result()]
                while not queue.empty() and len(batch) < MAX_HAVE_BATCH:
                    batch.append(queue.get_nowait())
                if _DROPPED in batch:
                    await self._send_frame(writer, bpb.HaveUpdate(dropped=True).SerializeToString())
                    return
                have = [i for i in batch if i < _FETCHING]
                fetching = [i - _FETCHING for i in batch if i >= _FETCHING]
                await self._send_frame(
                    writer, bpb.HaveUpdate(new_chunks=have, fetching=fetching).SerializeToString()
                )
        finally:
            hangup.cancel()
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(queue)
                if not watchers:
                    del self._watchers[key]
