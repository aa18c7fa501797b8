"""The fetch scheduler: download one version's chunks from many peers at once.

For every source (a holder found in the DHT, or the publisher) a watch stream keeps that
source's exact chunk bitmap up to date, plus hints of the chunks it has just requested. The
scheduler hands each source chunks that it holds and this node lacks, **rarest first** (fewest
sources hold or are fetching it; among equals each node walks the list from its own offset,
so nodes starting together do not collide), with at most `max_inflight_per_peer` requests in
flight per source; sources slower than half the best measured rate get half as many slots,
so faster peers do more of the work. While this node has other work in flight, the
publisher is asked only for chunks that no other source holds or is fetching: every copy
starts from the publisher's upload, so it should send each chunk out about once. When only
the last few missing chunks remain and each is already requested (the **endgame**), idle
sources are also asked for them, up to `endgame_max_requests` at once; the first verified
copy wins and the other requests are cancelled.

Every chunk is checked against the manifest before it is written (`VersionEntry.write_chunk`)
and only then announced and served. A source that sends a bad chunk or breaks the protocol
is banned (growing period) and its chunks are fetched elsewhere; a source that vanishes or
times out costs only its in-flight chunks and is retried later. The requests themselves (one
chunk, one bitmap stream) are `node.broadcast.requests`; the per-chunk counts of holders and
hints, `node.broadcast.availability`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.broadcast.availability import Availability, Source
from node.broadcast.config import BroadcastConfig
from node.broadcast.dialing import sample_holders
from node.broadcast.errors import DiskFull, FetchStalled, StoreError
from node.broadcast.fetch_progress import FetchProgress, ProgressMeter
from node.broadcast.records import HolderInfo
from node.broadcast.requests import NotHeld, open_watch, read_have_update, request_chunk
from node.broadcast.store import VersionEntry
from node.metrics import NO_TRANSFER_METRICS, TransferMetrics
from node.runtime import offload
from protocol import broadcast_pb2 as bpb
from protocol.chunk_bitmap import bitmap_get, parse_bitmap
from protocol.errors import InvalidMessage

logger = logging.getLogger(__name__)

_MIN_WATCH_S = 1.0
"""A source whose watch streams end sooner than this is dropped (retried later) rather than re-watched."""


class VersionFetch:
    """Downloads the missing chunks of one store entry from many sources; `run` returns when complete."""

    def __init__(
        self,
        *,
        p2p: P2P,
        entry: VersionEntry,
        config: BroadcastConfig,
        bans: BanList,
        own_peer_id: PeerID,
        publisher: PeerID,
        find_holders: Callable[[], Awaitable[list[HolderInfo]]],
        dial: Callable[[HolderInfo], Awaitable[None]],
        on_chunk: Callable[[int], None],
        on_request: Callable[[int], None] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        owner: str = "",
        metrics: TransferMetrics = NO_TRANSFER_METRICS,
    ) -> None:
        self.p2p = p2p
        self.entry = entry
        self.manifest = entry.manifest
        self.config = config
        self.bans = bans
        self.own_peer_id = own_peer_id
        self.publisher = publisher
        self.find_holders = find_holders
        self.dial = dial
        self.on_chunk = on_chunk
        self.on_request = on_request
        self.progress = progress
        self.owner = owner
        self.metrics = metrics
        self.sources: dict[bytes, Source] = {}
        self.chunks = Availability(self.manifest.num_chunks)
        self.requested: dict[int, set[bytes]] = {}
        self.retry_at: dict[bytes, float] = {}
        self.bytes_downloaded = 0
        """Chunk bytes received (bad ones and endgame duplicates included)."""
        self.bad_chunks = 0
        self.bytes_by_source: Counter[bytes] = Counter()
        """Chunk bytes received from each source (PeerID bytes)."""
        self.verified_by_source: Counter[bytes] = Counter()
        """Chunks each source delivered first that verified and were stored (what its transfer receipt counts)."""
        self.verified_bytes_by_source: Counter[bytes] = Counter()
        """Their bytes."""
        self._wake = asyncio.Event()
        self._stores: set[asyncio.Future[None]] = set()
        """Received chunks being verified and written (never cut short; `run` waits for them)."""
        self._rng = random.Random()
        # among equally rare chunks, each node walks the chunk list from its own offset: nodes that start
        # together then ask the publisher for different chunks instead of colliding at random
        offset = int.from_bytes(own_peer_id.to_bytes()[-8:], "big") % max(1, self.manifest.num_chunks)
        self._tiebreak = [(i - offset) % self.manifest.num_chunks for i in range(self.manifest.num_chunks)]
        self._meter = ProgressMeter()
        self._fatal: Exception | None = None

    # ---- sources -------------------------------------------------------------------------

    def _unusable(self, holder: HolderInfo) -> bool:
        """Whether `holder` cannot be added as a source now (already one, ourselves, banned, resting)."""
        peer_id = holder.peer_id
        key = peer_id.to_bytes()
        return (
            key in self.sources
            or peer_id == self.own_peer_id
            or self.bans.is_banned(peer_id)
            or self.retry_at.get(key, 0.0) > time.monotonic()
            or (self.config.publisher_only and peer_id != self.publisher)
        )

    def _add_source(self, holder: HolderInfo) -> None:
        if self._unusable(holder) or len(self.sources) >= self.config.max_sources:
            return
        source = Source(info=holder)
        self.sources[holder.peer_id.to_bytes()] = source
        source.watch_task = asyncio.create_task(self._watch(source))

    def _drop_source(self, source: Source, *, reason: str, ban: bool = False) -> None:
        key = source.peer_id.to_bytes()
        if self.sources.get(key) is not source:
            return
        del self.sources[key]
        if ban:
            self.bans.ban(source.peer_id, reason)
        else:
            logger.info("[%s] dropped source %s: %s", self.owner, source.peer_id.to_base58()[-8:], reason)
            self.retry_at[key] = time.monotonic() + self.config.retry_after_failure_s
        self.chunks.forget(source)
        for task in list(source.inflight.values()):
            if task is not asyncio.current_task():
                task.cancel()
        if source.watch_task is not None and source.watch_task is not asyncio.current_task():
            source.watch_task.cancel()
        for _, writer in source.idle_streams:
            writer.close()
        source.idle_streams.clear()
        self._wake.set()

    async def _watch(self, source: Source) -> None:
        """Follow a source's chunk bitmap until the watch fails; one the source closes after a while (the
        end of its lifetime, or a busy source evicting it) is opened again."""
        try:
            await self.dial(source.info)  # a holder is dialled only once it is picked as a source
            while True:
                opened = time.monotonic()
                await self._follow_one_watch(source)
                if time.monotonic() - opened < _MIN_WATCH_S:
                    raise ConnectionError("source keeps closing its bitmap stream")
        except asyncio.CancelledError:
            raise
        except InvalidMessage as exc:
            self._drop_source(source, reason=f"bad bitmap stream: {exc}", ban=True)
        except Exception as exc:
            self._drop_source(source, reason=f"bitmap stream ended: {exc!r}")

    async def _follow_one_watch(self, source: Source) -> None:
        """One watch stream: its full bitmap, then have/fetching updates; returns when the source closes it."""
        num_chunks = self.manifest.num_chunks
        reader, writer = await asyncio.wait_for(
            open_watch(self.p2p, source.peer_id, self.manifest), self.config.request_timeout_s
        )
        try:
            update = await read_have_update(reader, num_chunks)
            claimed = parse_bitmap(update.bitmap, num_chunks)
            if source.bitmap is None:
                source.bitmap = bytearray(len(claimed))
            for index in range(num_chunks):
                if bitmap_get(claimed, index):
                    self.chunks.mark_has(source, index)
            while True:
                self._apply_update(source, update)
                try:
                    update = await read_have_update(reader, num_chunks)
                except ConnectionError:
                    return
                if update.bitmap:
                    raise InvalidMessage("a second full bitmap on one watch stream")
        finally:
            writer.close()

    def _apply_update(self, source: Source, update: bpb.HaveUpdate) -> None:
        for index in update.new_chunks:
            self.chunks.mark_has(source, index)
        for index in update.fetching:
            self.chunks.mark_fetching(source, index)
        self._wake.set()

    async def _refresh_sources(self) -> None:
        """Add the publisher and a capped random sample of the announced holders as sources, now and
        every `holder_refresh_s`."""
        while True:
            with contextlib.suppress(Exception):
                holders = await self.find_holders()
                publisher = next(
                    (h for h in holders if h.peer_id == self.publisher), HolderInfo(self.publisher, 0, 0)
                )
                others = [h for h in holders if h.peer_id != self.publisher]
                self._add_source(publisher)
                for holder in sample_holders(
                    others, self.config.max_holders_considered, self._unusable, self._rng
                ):
                    self._add_source(holder)
            self._wake.set()
            await asyncio.sleep(self.config.holder_refresh_s)

    # ---- requests ------------------------------------------------------------------------

    async def _fetch_chunk(self, source: Source, index: int) -> None:
        key = source.peer_id.to_bytes()
        started = time.monotonic()
        try:
            try:
                data = await asyncio.wait_for(
                    request_chunk(self.p2p, source.peer_id, self.manifest, index, source.idle_streams),
                    self.config.request_timeout_s,
                )
            except NotHeld:
                self.chunks.mark_lacks(source, index)
                return
            except InvalidMessage as exc:
                self._drop_source(source, reason=f"protocol violation: {exc}", ban=True)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._drop_source(source, reason=f"request failed: {exc!r}")
                return
            elapsed = max(time.monotonic() - started, 1e-3)
            self.bytes_downloaded += len(data)
            self.bytes_by_source[key] += len(data)
            self.metrics.chunk_received(len(data))
            # verifying, writing and announcing a received chunk is never cut short, even when the
            # fetch completes (or a duplicate wins) meanwhile
            store = asyncio.ensure_future(self._store(source, index, data, elapsed))
            self._stores.add(store)
            store.add_done_callback(self._stores.discard)
            await asyncio.shield(store)
        finally:
            if source.inflight.get(index) is asyncio.current_task():
                del source.inflight[index]
            holders = self.requested.get(index)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self.requested[index]
            self._wake.set()

    async def _store(self, source: Source, index: int, data: bytes, elapsed_s: float) -> None:
        key = source.peer_id.to_bytes()
        try:
            written = await offload(self.entry.write_chunk, index, data)
        except InvalidMessage as exc:
            self.bad_chunks += 1
            self._drop_source(source, reason=f"bad chunk: {exc}", ban=True)
            return
        except (DiskFull, StoreError) as exc:  # nothing another source could fix: stop the fetch
            self._fatal = exc
            self._wake.set()
            return
        rate = len(data) / elapsed_s
        source.rate_bytes_per_s = (
            rate if source.rate_bytes_per_s is None else 0.7 * source.rate_bytes_per_s + 0.3 * rate
        )
        source.last_delivery = time.monotonic()
        self._meter.delivered(len(data))
        if written:
            self.verified_by_source[key] += 1
            self.verified_bytes_by_source[key] += len(data)
            self.metrics.chunk_fetched()
            self.on_chunk(index)
            for other_key in self.requested.get(index, set()) - {key}:
                other = self.sources.get(other_key)
                if other is not None and index in other.inflight:
                    other.inflight[index].cancel()

    # ---- scheduling ----------------------------------------------------------------------

    def _slots(self, source: Source, best_rate: float) -> int:
        limit = self.config.max_inflight_per_peer
        if source.rate_bytes_per_s is not None and source.rate_bytes_per_s < 0.5 * best_rate:
            limit = max(1, limit // 2)
        return limit - len(source.inflight)

    def _start(self, source: Source, index: int) -> None:
        first = index not in self.requested
        source.inflight[index] = asyncio.create_task(self._fetch_chunk(source, index))
        self.requested.setdefault(index, set()).add(source.peer_id.to_bytes())
        if first and self.on_request is not None:
            self.on_request(index)

    def _schedule(self) -> None:
        missing = self.entry.missing()
        unassigned = sorted(
            (i for i in missing if i not in self.requested and self.chunks.holders[i] > 0),
            key=lambda i: (self.chunks.rarity(i), self._tiebreak[i]),
        )
        taken: set[int] = set()
        ready = [s for s in self.sources.values() if s.bitmap is not None]
        rates = [s.rate_bytes_per_s for s in ready if s.rate_bytes_per_s is not None]
        best_rate = max(rates) if rates else 0.0
        # fastest first, unknown rates after them in random order, the publisher last
        self._rng.shuffle(ready)
        ready.sort(key=lambda s: (s.peer_id == self.publisher, -(s.rate_bytes_per_s or 0.0)))
        busy = any(s.inflight for s in self.sources.values())
        # the endgame (duplicate requests) only for the last few chunks: earlier, every missing chunk being
        # requested once just means the sources are busy
        endgame_size = max(self.config.max_inflight_per_peer, self.manifest.num_chunks // 20)
        for source in ready:
            slots = self._slots(source, best_rate)
            bitmap = source.bitmap
            assert bitmap is not None
            # the publisher's upload is what every copy starts from: while this node has other work, ask it
            # only for chunks no other peer holds or is fetching, so it sends each chunk out about once
            spare_publisher = source.peer_id == self.publisher and len(ready) > 1 and busy
            for index in unassigned:
                if slots <= 0:
                    break
                if index in taken or not bitmap_get(bitmap, index):
                    continue
                if spare_publisher and (self.chunks.holders[index] > 1 or self.chunks.fetching[index] > 0):
                    continue
                taken.add(index)
                self._start(source, index)
                busy = True
                slots -= 1
            if slots <= 0 or len(taken) < len(unassigned) or spare_publisher or len(missing) > endgame_size:
                continue
            # endgame: every missing chunk this source could give is requested already
            key = source.peer_id.to_bytes()
            candidates = sorted(
                (
                    i
                    for i, holders in self.requested.items()
                    if key not in holders
                    and len(holders) < self.config.endgame_max_requests
                    and bitmap_get(bitmap, i)
                    and not self.entry.has(i)
                ),
                key=lambda i: (len(self.requested[i]), self._tiebreak[i]),
            )
            for index in candidates[:slots]:
                self._start(source, index)

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(
                self._meter.snapshot(
                    chunks_done=self.entry.chunks_held,
                    num_chunks=self.manifest.num_chunks,
                    chunk_bytes=self.manifest.chunk_bytes,
                    total_bytes=self.manifest.total_bytes,
                    last_deliveries=[s.last_delivery for s in self.sources.values()],
                )
            )

    async def run(self) -> None:
        """Fetch until every chunk is held and verified."""
        refresher = asyncio.create_task(self._refresh_sources())
        last_report = 0.0
        progress_at, progress_bytes = time.monotonic(), self.bytes_downloaded
        try:
            while not self.entry.complete:
                if self._fatal is not None:
                    raise self._fatal
                if self.bytes_downloaded != progress_bytes:
                    progress_at, progress_bytes = time.monotonic(), self.bytes_downloaded
                elif time.monotonic() - progress_at > self.config.stall_timeout_s:
                    raise FetchStalled(
                        f"no chunk of {self.manifest.run_id} v{self.manifest.version} arrived for "
                        f"{self.config.stall_timeout_s:.0f} s: no reachable peer holds the rest (the publisher may "
                        "have replaced this version with a newer one); fetch again"
                    )
                self._wake.clear()
                self._schedule()
                if time.monotonic() - last_report > 0.25:
                    self._report()
                    last_report = time.monotonic()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            self._report()
        finally:
            refresher.cancel()
            for source in list(self.sources.values()):
                for task in list(source.inflight.values()):
                    task.cancel()
                if source.watch_task is not None:
                    source.watch_task.cancel()
                for _, writer in source.idle_streams:
                    writer.close()
            pending = [
                t
                for s in self.sources.values()
                for t in [*s.inflight.values(), s.watch_task]
                if t is not None
            ]
            pending.append(refresher)
            await asyncio.gather(*pending, return_exceptions=True)
            # a chunk whose write completed the version may still be on its way to being counted:
            # the sources' tallies (what transfer receipts attest) are final only once it is
            await asyncio.gather(*self._stores, return_exceptions=True)
            self.sources.clear()
