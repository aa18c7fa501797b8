"""`WeightBroadcast`: one node's part in the weight broadcast (publish, fetch, serve, follow, status).

A runtime service (`name`, `async start()`, `async stop()`) that wires the chunk store
(`store`), the serving side (`service`), the fetch scheduler (`fetch`, `manifest_fetch`) and
the DHT records (`records`):

- publishing signs a manifest, stores the file as a complete version, serves it and puts a
  signed **pointer** in the DHT (under the run's `latest` key and the version's key);
- fetching reads the pointer (only from authorised publishers), fetches a manifest of the
  pointer's content id (signed by any authorised publisher) from the publisher or any holder,
  announces itself as a holder at once and downloads the chunks from every holder of that
  content, whoever published it (see `node.broadcast.fetch`),
  serving each chunk as soon as it is verified on disk;
- while it runs, holder announcements (and the publisher's pointers) are refreshed for every
  version kept; versions beyond `keep_versions` are deleted and no longer announced;
- `follow` fetches each new version of a run as it is announced;
- after each fetch, the transfer receipts it signs for its sources go to `on_receipts`
  (`node.broadcast.transfer_receipts`; a node's `ReceiptExchange.record` stores them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hivemind
from hivemind.p2p import P2P, PeerID

from node.attestations import AttestationBook
from node.bans import BanList
from node.broadcast.config import BroadcastConfig
from node.broadcast.dialing import HolderDialer
from node.broadcast.errors import FetchStalled, StoreError, VersionSuperseded, WeightsUnavailable
from node.broadcast.fetch import VersionFetch
from node.broadcast.fetch_progress import FetchProgress
from node.broadcast.manifest_fetch import obtain_manifest
from node.broadcast.publish import prepare_file, prepare_state_dict
from node.broadcast.records import BroadcastRecords, HolderInfo
from node.broadcast.service import BroadcastService
from node.broadcast.store import ChunkStore, VersionEntry
from node.broadcast.transfer_receipts import sign_transfer_receipts
from node.broadcast.version_status import VersionStatus, version_statuses
from node.identity import Identity
from node.metrics import NO_TRANSFER_METRICS, NodeMetrics, TransferMetrics
from node.runtime import in_dht, offload
from node.signed_records import SignedRecords
from protocol.dht_keys import validate_run_id
from protocol.errors import ConfigError, HivenetError
from protocol.manifest import Manifest

logger = logging.getLogger(__name__)

_NEWEST_ATTEMPTS = 3


class BroadcastNotStarted(HivenetError):
    """The weight broadcast was used before `start()` (or after `stop()`)."""


@dataclass
class _Running:
    """What exists only while the broadcast runs (bound to the event loop that started it)."""

    p2p: P2P
    owns_p2p: bool
    service: BroadcastService
    records: BroadcastRecords
    dialer: HolderDialer


class WeightBroadcast:
    """A node's weight-broadcast service: construct it, then `await start()` on the node's loop
    (or `node.add_service(...)`); `await stop()` when done."""

    name = "weight-broadcast"

    def __init__(
        self,
        *,
        dht: hivemind.DHT,
        identity: Identity,
        config: BroadcastConfig,
        p2p: P2P | None = None,
        metrics: NodeMetrics | None = None,
        on_receipts: Callable[[list[bytes]], None] | None = None,
        attestations: AttestationBook | None = None,
    ) -> None:
        """`metrics`: the hosting node's metrics, which count chunks, bytes and bans (default: none);
        `on_receipts`: handed the transfer receipts this node signs after each fetch (must not block);
        `attestations`: the hosting node's (`HivenetNode.attestations`): its holder announcements
        carry its own, and in a public swarm holders are dialled only at addresses its trusted
        attesters attested (default: none, so no holder address is dialled there)."""
        self.dht = dht
        self.identity = identity
        self.config = config
        self.metrics: TransferMetrics = metrics if metrics is not None else NO_TRANSFER_METRICS
        self.peer_id = identity.peer_id
        self.owner = identity.short_id
        self.authorized = {PeerID.from_base58(text).to_bytes() for text in config.authorized_publishers}
        self.store = ChunkStore(config.store_dir)
        self.bans = BanList(
            config.ban_base_s, config.ban_max_s, owner=self.owner,
            on_ban=metrics.peer_banned if metrics is not None else None,
        )  # fmt: skip
        self.last_fetch: VersionFetch | None = None
        # times a fetch of the newest version found no manifest and looked for a newer version
        self.supersession_checks = 0
        self.on_receipts = on_receipts
        self.attestations = attestations or AttestationBook(identity.peer_id_bytes)
        self._given_p2p = p2p
        self._running: _Running | None = None
        self._fetch_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._followers: set[asyncio.Task[None]] = set()

    @property
    def _live(self) -> _Running:
        if self._running is None:
            raise BroadcastNotStarted("the weight broadcast is not running: await start() first")
        return self._running

    @property
    def p2p(self) -> P2P:
        return self._live.p2p

    @property
    def service(self) -> BroadcastService:
        return self._live.service

    def chunk_stored(self, entry: VersionEntry, index: int) -> None:
        """A fetch stored a verified chunk of `entry`: serve it. A chunk whose write completes after the
        broadcast stopped is on disk and nothing more (there is nobody left to serve it to)."""
        running = self._running
        if running is not None:
            running.service.chunk_added(entry, index)

    def chunk_wanted(self, entry: VersionEntry, index: int) -> None:
        """A fetch requested chunk `index` of `entry` (for the service's bookkeeping), while running."""
        running = self._running
        if running is not None:
            running.service.chunk_requested(entry, index)

    @property
    def records(self) -> BroadcastRecords:
        return self._live.records

    @property
    def dialer(self) -> HolderDialer:
        return self._live.dialer

    async def start(self) -> None:
        """Start serving, re-open (and re-verify) the versions already in the store, start announcing."""
        p2p = self._given_p2p
        if p2p is None:
            # a replica of our own (hivemind's cached one is bound to the first event loop that made it)
            p2p = await P2P.replicate(await in_dht(self.dht, hivemind.DHT._get_p2p_daemon_listen_maddr))
        service = BroadcastService(
            p2p=p2p, config=self.config, bans=self.bans, owner=self.owner, metrics=self.metrics
        )
        records = BroadcastRecords(
            signed=SignedRecords(self.dht, self.identity),
            p2p=p2p,
            config=self.config,
            authorized=self.authorized,
            held=service.offered,
            owner=self.owner,
            own_attestations=self.attestations.current,
        )
        dialer = HolderDialer(
            p2p,
            self.peer_id,
            records.own_addresses,
            self.attestations.trusted,
            networks=self.attestations.dialable_networks,
        )
        self._running = _Running(
            p2p=p2p, owns_p2p=self._given_p2p is None, service=service, records=records, dialer=dialer
        )
        try:
            await service.start()
            await offload(self._reopen_store)
        except BaseException:
            await self.stop()
            raise
        records.start_announcing()

    def _reopen_store(self) -> None:
        if not self.store.root.is_dir():
            return
        for run_dir in sorted(self.store.root.iterdir()):
            if not run_dir.is_dir() or run_dir.name.startswith("."):
                continue
            try:
                validate_run_id(run_dir.name)
            except ConfigError:
                continue
            for version in self.store.versions(run_dir.name):
                entry = self.store.get(run_dir.name, version)
                if entry is None:
                    continue
                if entry.manifest.publisher not in self.authorized:
                    logger.warning(
                        "[%s] removing %s/%s: publisher not authorised", self.owner, run_dir.name, version
                    )
                    self.store.remove(run_dir.name, version)
                    continue
                if entry.manifest.publisher == self.identity.peer_id_bytes:
                    self.records.published[(entry.run_id, entry.version)] = entry.manifest
                self.service.offer(entry)

    async def stop(self) -> None:
        """Stop following, announcing and serving; close the store."""
        running, self._running = self._running, None
        followers = list(self._followers)
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        if running is None:
            return
        await running.records.stop_announcing()
        await running.service.stop()
        self.store.close()
        if running.owns_p2p:
            with contextlib.suppress(Exception):
                await running.p2p.shutdown()

    def _prune(self, run_id: str) -> None:
        protect = {
            version
            for (run, version) in self._fetch_locks
            if run == run_id and self._fetch_locks[(run, version)].locked()
        }
        kept = set(self.store.versions(run_id)[-self.config.keep_versions :])
        serving = [
            v for v in self.service.recently_served(run_id, self.config.serving_grace_s) if v not in kept
        ]
        protect.update(serving[: self.config.keep_versions])
        for version in self.store.prune(run_id, self.config.keep_versions, protect=protect):
            logger.debug("[%s] pruned version %s of run %s", self.owner, version, run_id)
            self.service.withdraw(run_id, version)
            self.records.published.pop((run_id, version), None)

    # ---- publish -------------------------------------------------------------------------

    async def _publish_entry(self, entry: VersionEntry) -> Manifest:
        manifest = entry.manifest
        if self.identity.peer_id_bytes not in self.authorized:
            logger.warning(
                "[%s] publishing %s/%s although this node is not in authorized_publishers: peers will refuse it",
                self.owner,
                manifest.run_id,
                manifest.version,
            )
        self.records.published[(manifest.run_id, manifest.version)] = manifest
        self.service.offer(entry)
        self._prune(manifest.run_id)
        await self.records.announce_holder(entry)
        await self.records.announce_pointer(manifest)
        logger.info(
            "[%s] published %s v%s: %d bytes in %d chunks",
            self.owner,
            manifest.run_id,
            manifest.version,
            manifest.total_bytes,
            manifest.num_chunks,
        )
        return manifest

    async def publish(self, run_id: str, version: int, state_dict: Mapping[str, Any]) -> Manifest:
        """Serialise `state_dict` (safetensors), sign its manifest, serve it and announce it in the DHT."""
        entry = await offload(
            prepare_state_dict,
            self.store,
            self.identity.private_key,
            run_id=validate_run_id(run_id),
            version=version,
            state_dict=state_dict,
            chunk_bytes=self.config.chunk_bytes,
        )
        return await self._publish_entry(entry)

    async def publish_file(self, run_id: str, version: int, path: Path) -> Manifest:
        """Publish an existing safetensors file (copied into the store)."""
        entry = await offload(
            prepare_file,
            self.store,
            self.identity.private_key,
            run_id=validate_run_id(run_id),
            version=version,
            path=Path(path),
            chunk_bytes=self.config.chunk_bytes,
        )
        return await self._publish_entry(entry)

    # ---- fetch ---------------------------------------------------------------------------

    async def fetch(
        self,
        run_id: str,
        version: int | None = None,
        *,
        progress: Callable[[FetchProgress], None] | None = None,
        manifest_timeout_s: float = 60.0,
    ) -> VersionEntry:
        """Fetch a version (the newest when None) completely and verified; return its store entry.

        Resumes from the chunks already on disk. Raises WeightsUnavailable if no authorised
        pointer or no manifest can be found, DiskFull if it does not fit on disk. Fetching the
        newest version, a fetch that stalls because that version was replaced (and deleted by its
        holders) moves on to the new newest one, a few times at most; one whose manifest nobody
        serves any more because a newer version replaced it moves on at once, for as long as
        `manifest_timeout_s` lasts.
        """
        deadline = time.monotonic() + manifest_timeout_s
        attempt = 0
        while True:
            try:
                remaining = max(0.0, deadline - time.monotonic())
                return await self._fetch_once(run_id, version, progress, remaining)
            except VersionSuperseded:
                if time.monotonic() > deadline:
                    raise
                logger.info(
                    "[%s] the newest version of %s was replaced; fetching the new one", self.owner, run_id
                )
                continue
            except FetchStalled:
                attempt += 1
                if version is not None or attempt == _NEWEST_ATTEMPTS:
                    raise
                logger.info(
                    "[%s] the newest version of %s was replaced mid-fetch; fetching the new one",
                    self.owner,
                    run_id,
                )

    async def _fetch_once(
        self,
        run_id: str,
        version: int | None,
        progress: Callable[[FetchProgress], None] | None,
        manifest_timeout_s: float,
    ) -> VersionEntry:
        validate_run_id(run_id)
        if not self.authorized:
            raise ConfigError("no authorised publishers configured for this run: set authorized_publishers")
        pointer = await self.records.find_pointer(run_id, version)
        if pointer is None:
            local = self.store.get(run_id, version) if version is not None else None
            if local is not None and local.complete:
                return local
            which = "any version" if version is None else f"version {version}"
            raise WeightsUnavailable(
                f"no authorised publisher announced {which} of run {run_id!r} in the DHT; "
                "check the run id, the authorised publishers and that the publisher is online"
            )
        key = (run_id, pointer.version)

        async def find_holders() -> list[HolderInfo]:
            return await self.records.find_holders(run_id, pointer.version, pointer.content_id)

        lock = self._fetch_locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self.store.get(run_id, pointer.version)
            if entry is not None and entry.manifest.content_id != pointer.content_id:
                raise StoreError(
                    f"the store holds different content for {run_id} v{pointer.version} than the publisher's "
                    "pointer names; delete that version from the store"
                )
            if entry is None:
                manifest = await obtain_manifest(
                    self.p2p,
                    pointer,
                    find_holders=find_holders,
                    dial=self.dialer.dial,
                    max_holders=self.config.max_holders_considered,
                    own_peer_id=self.peer_id,
                    bans=self.bans,
                    authorized=self.authorized,
                    request_timeout_s=self.config.request_timeout_s,
                    deadline_s=manifest_timeout_s,
                    owner=self.owner,
                    superseded=None
                    if version is not None
                    else lambda: self._superseded(run_id, pointer.version),
                )
                entry = await offload(self.store.create, manifest)
            self.service.offer(entry)
            if not entry.complete:
                with contextlib.suppress(Exception):
                    await self.records.announce_holder(entry)
                fetcher = VersionFetch(
                    p2p=self.p2p,
                    entry=entry,
                    config=self.config,
                    bans=self.bans,
                    own_peer_id=self.peer_id,
                    publisher=PeerID(pointer.publisher),
                    find_holders=find_holders,
                    dial=self.dialer.dial,
                    on_chunk=lambda index: self.chunk_stored(entry, index),
                    on_request=lambda index: self.chunk_wanted(entry, index),
                    progress=progress,
                    owner=self.owner,
                    metrics=self.metrics,
                )
                self.last_fetch = fetcher
                try:
                    await fetcher.run()
                finally:  # what verified is receipted, even if the rest of the fetch failed
                    if self.on_receipts is not None and fetcher.verified_by_source:
                        self.on_receipts(sign_transfer_receipts(fetcher, self.identity.private_key))
            with contextlib.suppress(Exception):
                await self.records.announce_holder(entry)
        self._prune(run_id)
        return entry

    async def _superseded(self, run_id: str, version: int) -> bool:
        """Whether the newest authorised pointer of `run_id` now names a version after `version`."""
        self.supersession_checks += 1
        newest = await self.records.find_pointer(run_id)
        return newest is not None and newest.version > version

    async def load(self, run_id: str, version: int) -> dict[str, Any]:
        """The state dict of a complete version in the store (torch tensors)."""
        entry = self.store.get(run_id, version)
        if entry is None:
            raise StoreError(f"version {version} of run {run_id} is not in the store; fetch it first")
        return await offload(entry.load_state_dict)

    # ---- follow and status ---------------------------------------------------------------

    def follow(
        self,
        run_id: str,
        on_version: Callable[[VersionEntry], Any] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
    ) -> asyncio.Task[None]:
        """Fetch each new version of `run_id` as it is announced (until the returned task is cancelled)."""

        async def loop() -> None:
            while True:
                try:
                    pointer = await self.records.find_pointer(run_id)
                    held = [
                        v
                        for v in self.store.versions(run_id)
                        if (e := self.store.get(run_id, v)) and e.complete
                    ]
                    if pointer is not None and (not held or pointer.version > max(held)):
                        entry = await self.fetch(run_id, pointer.version, progress=progress)
                        if on_version is not None:
                            result = on_version(entry)
                            if asyncio.iscoroutine(result):
                                await result
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    logger.warning("[%s] following %s: %s", self.owner, run_id, exc)
                await asyncio.sleep(self.config.follow_poll_s)

        task = asyncio.create_task(loop())
        self._followers.add(task)
        task.add_done_callback(self._followers.discard)
        return task

    async def status(self, run_id: str) -> list[VersionStatus]:
        """Versions of `run_id` known here (held locally or newest announced), with holders and completeness."""
        return await version_statuses(self.store, self.records, run_id)


__all__ = ["HolderInfo", "VersionStatus", "WeightBroadcast"]
