"""`WeightBroadcast`: one node's part in the weight broadcast (publish, fetch, serve, follow, status).

It wires the chunk store, the serving service, the fetch scheduler and the DHT records:

- publishing signs a manifest, stores the file as a complete version, serves it and puts a
  signed **pointer** in the DHT (under the run's `latest` key and the version's key);
- fetching reads the pointer (only from authorised publishers), fetches the manifest from the
  publisher or any holder and checks it against the pointer's hash, announces itself as a
  holder at once and downloads the chunks from everyone (see `node.broadcast.fetch`),
  serving each chunk as soon as it is verified on disk;
- a background loop refreshes holder announcements (and the publisher's pointers) for every
  version kept; versions beyond `keep_versions` are deleted and no longer announced;
- `follow` fetches each new version of a run as it is announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hivemind
from hivemind.p2p import P2P, PeerID
from multiaddr import Multiaddr

from node.bans import BanList
from node.broadcast.config import BroadcastConfig
from node.broadcast.errors import StoreError, WeightsUnavailable
from node.broadcast.fetch import FetchProgress, NotHeld, VersionFetch, request_frame
from node.broadcast.publish import prepare_file, prepare_state_dict
from node.broadcast.service import PROTO_MANIFEST, BroadcastService
from node.broadcast.store import ChunkStore, VersionEntry
from node.broadcast.wire import read_payload
from node.identity import Identity
from protocol import broadcast_pb2 as bpb
from protocol.dht_keys import (
    signed_subkey,
    validate_run_id,
    weights_holders_key,
    weights_pointer_key,
    weights_version_key,
)
from protocol.envelope import open_envelope, seal
from protocol.errors import ConfigError, InvalidMessage
from protocol.limits import MAX_ADDRESSES, MAX_HOLDER_TTL_S, MAX_WEIGHTS_POINTER_TTL_S
from protocol.manifest import (
    WEIGHTS_HOLDER_DOMAIN,
    WEIGHTS_POINTER_DOMAIN,
    HolderAnnouncement,
    Manifest,
    WeightsPointer,
    parse_manifest,
)

logger = logging.getLogger(__name__)


@dataclass
class HolderInfo:
    """A peer that announced a version in the DHT (its claim; chunks are verified on arrival)."""

    peer_id: PeerID
    chunks_held: int
    num_chunks: int
    addresses: tuple[str, ...] = ()


@dataclass
class VersionStatus:
    """What is known about one version of a run."""

    version: int
    manifest_sha256: bytes
    publisher: PeerID
    total_bytes: int
    num_chunks: int
    local_chunks: int
    """Chunks of this version held (verified) by this node."""
    holders: list[HolderInfo] = field(default_factory=list)


class WeightBroadcast:
    """A node's weight-broadcast component. Create with `await WeightBroadcast.create(...)`."""

    def __init__(self, *, dht: hivemind.DHT, p2p: P2P, identity: Identity, config: BroadcastConfig) -> None:
        self.dht = dht
        self.p2p = p2p
        self.identity = identity
        self.config = config
        self.peer_id = identity.peer_id
        self.owner = identity.short_id
        self.authorized = {PeerID.from_base58(text).to_bytes() for text in config.authorized_publishers}
        self.store = ChunkStore(config.store_dir)
        self.bans = BanList(config.ban_base_s, config.ban_max_s, owner=self.owner)
        self.service = BroadcastService(p2p=p2p, config=config, bans=self.bans, owner=self.owner)
        self.published: dict[tuple[str, int], Manifest] = {}
        self.last_fetch: VersionFetch | None = None
        self._fetch_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._announcer: asyncio.Task[None] | None = None
        self._followers: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._owns_p2p = False
        self._addresses: tuple[str, ...] | None = None
        self._dialed: dict[bytes, float] = {}

    @classmethod
    async def create(
        cls, *, dht: hivemind.DHT, identity: Identity, config: BroadcastConfig, p2p: P2P | None = None
    ) -> WeightBroadcast:
        """Start serving, re-open (and re-verify) the versions already in the store, start announcing."""
        owns_p2p = p2p is None
        if p2p is None:
            # a replica of our own (hivemind's cached one is bound to the first event loop that made it)
            maddr = await asyncio.to_thread(dht.run_coroutine, hivemind.DHT._get_p2p_daemon_listen_maddr)
            p2p = await P2P.replicate(maddr)
        self = cls(dht=dht, p2p=p2p, identity=identity, config=config)
        self._owns_p2p = owns_p2p
        await self.service.start()
        await asyncio.to_thread(self._reopen_store)
        self._announcer = asyncio.create_task(self._announce_loop())
        return self

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
                    self.published[(entry.run_id, entry.version)] = entry.manifest
                self.service.offer(entry)

    async def shutdown(self) -> None:
        """Stop following, announcing and serving; close the store."""
        tasks = [t for t in (*self._followers, self._announcer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.service.stop()
        self.store.close()
        if self._owns_p2p:
            with contextlib.suppress(Exception):
                await self.p2p.shutdown()

    # ---- DHT records ---------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq = max(self._seq + 1, int(time.time() * 1000))
        return self._seq

    async def _store_signed(self, key: str, domain: str, run_id: str, payload: bytes, ttl_s: float) -> bool:
        expires_at = time.time() + ttl_s
        value = seal(
            self.identity.private_key,
            domain=domain,
            run_id=run_id,
            payload=payload,
            expires_at=expires_at,
            seq=self._next_seq(),
            dht_key=key,
        )
        subkey = signed_subkey(self.peer_id.to_base58())
        result = await self.dht.store(key, value, expires_at, subkey=subkey, return_future=True)
        return bool(result)

    async def _get_signed(
        self, key: str, domain: str, run_id: str, max_ttl_s: float
    ) -> list[tuple[bytes, bytes]]:
        """[(signer PeerID bytes, payload)] of every valid signed value under `key`."""
        found = await self.dht.get(key, latest=True, return_future=True)
        if found is None or not isinstance(found.value, dict):
            return []
        results = []
        for subkey, item in found.value.items():
            try:
                if not (isinstance(subkey, str) and subkey.startswith("hn:")):
                    continue
                signer = PeerID.from_base58(subkey[3:]).to_bytes()
                envelope = open_envelope(
                    item.value, domain=domain, run_id=run_id, dht_key=key, signer=signer, max_ttl_s=max_ttl_s
                )
                results.append((envelope.signer, envelope.payload))
            except Exception as exc:
                logger.debug("[%s] ignoring DHT value under %s: %r", self.owner, key, exc)
        return results

    async def find_pointer(self, run_id: str, version: int | None = None) -> WeightsPointer | None:
        """The authorised pointer to `version`, or to the newest version when None; None if there is none."""
        key = weights_pointer_key(run_id) if version is None else weights_version_key(run_id, version)
        best: WeightsPointer | None = None
        for signer, payload in await self._get_signed(
            key, WEIGHTS_POINTER_DOMAIN, run_id, MAX_WEIGHTS_POINTER_TTL_S
        ):
            try:
                pointer = WeightsPointer.from_payload(payload)
            except InvalidMessage:
                continue
            if pointer.publisher != signer or pointer.run_id != run_id:
                continue
            if signer not in self.authorized:
                logger.info("[%s] ignoring weights pointer from unauthorised %s", self.owner, PeerID(signer))
                continue
            if version is not None and pointer.version != version:
                continue
            if best is None or (pointer.version, pointer.publisher) > (best.version, best.publisher):
                best = pointer
        return best

    async def find_holders(self, run_id: str, version: int, manifest_sha256: bytes) -> list[HolderInfo]:
        """Peers that announced `version` (with this manifest) in the DHT."""
        key = weights_holders_key(run_id, version)
        holders = []
        for signer, payload in await self._get_signed(key, WEIGHTS_HOLDER_DOMAIN, run_id, MAX_HOLDER_TTL_S):
            try:
                announcement = HolderAnnouncement.from_payload(payload)
            except InvalidMessage:
                continue
            if announcement.version != version or announcement.manifest_sha256 != manifest_sha256:
                continue
            holders.append(
                HolderInfo(
                    PeerID(signer), announcement.chunks_held, announcement.num_chunks, announcement.addresses
                )
            )
        return holders

    async def _announce_holder(self, entry: VersionEntry) -> None:
        announcement = HolderAnnouncement(
            run_id=entry.run_id,
            version=entry.version,
            manifest_sha256=entry.manifest.sha256,
            chunks_held=entry.chunks_held,
            num_chunks=entry.manifest.num_chunks,
            addresses=await self._own_addresses(),
        )
        await self._store_signed(
            weights_holders_key(entry.run_id, entry.version),
            WEIGHTS_HOLDER_DOMAIN,
            entry.run_id,
            announcement.to_payload(),
            self.config.holder_ttl_s,
        )

    async def _own_addresses(self) -> tuple[str, ...]:
        if self._addresses is None:
            try:
                maddrs = await self.p2p.get_visible_maddrs()
            except Exception:
                return ()
            own = f"/p2p/{self.peer_id.to_base58()}"
            cleaned = {str(m).removesuffix(own) for m in maddrs if "p2p-circuit" not in str(m)}
            self._addresses = tuple(sorted(cleaned))[:MAX_ADDRESSES]
        return self._addresses

    async def _dial(self, holder: HolderInfo) -> None:
        """Make sure p2pd knows how to reach `holder` (a holder's addresses come from its signed announcement)."""
        key = holder.peer_id.to_bytes()
        if (
            not holder.addresses
            or holder.peer_id == self.peer_id
            or self._dialed.get(key, 0.0) > time.monotonic()
        ):
            return
        self._dialed[key] = time.monotonic() + 30.0
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.p2p._client.connect(holder.peer_id, [Multiaddr(a) for a in holder.addresses]),
                timeout=5.0,
            )

    async def _announce_pointer(self, manifest: Manifest, latest: bool) -> None:
        payload = manifest.pointer().to_payload()
        keys = [weights_version_key(manifest.run_id, manifest.version)]
        if latest:
            keys.append(weights_pointer_key(manifest.run_id))
        for key in keys:
            await self._store_signed(
                key, WEIGHTS_POINTER_DOMAIN, manifest.run_id, payload, self.config.pointer_ttl_s
            )

    async def _announce_all(self) -> None:
        for entry in self.service.offered():
            with contextlib.suppress(Exception):
                await self._announce_holder(entry)
        newest: dict[str, int] = {}
        for run_id, version in self.published:
            newest[run_id] = max(newest.get(run_id, version), version)
        for (run_id, version), manifest in list(self.published.items()):
            with contextlib.suppress(Exception):
                await self._announce_pointer(manifest, latest=newest[run_id] == version)

    async def _announce_loop(self) -> None:
        interval = min(self.config.holder_ttl_s, self.config.pointer_ttl_s) / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._announce_all()
            except Exception as exc:
                logger.info("[%s] announcing failed: %r", self.owner, exc)

    def _prune(self, run_id: str) -> None:
        protect = {
            version
            for (run, version) in self._fetch_locks
            if run == run_id and self._fetch_locks[(run, version)].locked()
        }
        for version in self.store.prune(run_id, self.config.keep_versions, protect=protect):
            logger.info("[%s] pruned version %s of run %s", self.owner, version, run_id)
            self.service.withdraw(run_id, version)
            self.published.pop((run_id, version), None)

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
        self.published[(manifest.run_id, manifest.version)] = manifest
        self.service.offer(entry)
        self._prune(manifest.run_id)
        newest = max(v for (run, v) in self.published if run == manifest.run_id)
        await self._announce_holder(entry)
        await self._announce_pointer(manifest, latest=manifest.version == newest)
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
        entry = await asyncio.to_thread(
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
        entry = await asyncio.to_thread(
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

    async def call_manifest(self, peer_id: PeerID, pointer: WeightsPointer) -> Manifest:
        """Fetch a version's manifest from one peer, reading at most the size the signed pointer declares."""
        request = bpb.ManifestRequest(
            run_id=pointer.run_id, version=pointer.version, manifest_sha256=pointer.manifest_sha256
        ).SerializeToString()

        async def call() -> bytes:
            header, (reader, writer) = await request_frame(self.p2p, peer_id, PROTO_MANIFEST, request)
            try:
                if header.status == bpb.STATUS_NOT_FOUND:
                    raise NotHeld("manifest")
                if header.status != bpb.STATUS_OK:
                    raise ConnectionError(f"manifest request refused: {bpb.Status.Name(header.status)}")
                return await read_payload(reader, header.payload_bytes, pointer.manifest_bytes)
            finally:
                writer.close()

        raw = await asyncio.wait_for(call(), self.config.request_timeout_s)
        return parse_manifest(
            raw,
            expected_sha256=pointer.manifest_sha256,
            run_id=pointer.run_id,
            version=pointer.version,
            authorized_publishers=self.authorized,
        )

    async def _obtain_manifest(self, pointer: WeightsPointer, deadline_s: float) -> Manifest:
        deadline = time.monotonic() + deadline_s
        publisher = PeerID(pointer.publisher)
        while True:
            holders = await self._holder_ids(pointer)
            random.shuffle(holders)
            for peer_id in [publisher, *holders]:
                if peer_id == self.peer_id or self.bans.is_banned(peer_id):
                    continue
                try:
                    return await self.call_manifest(peer_id, pointer)
                except InvalidMessage as exc:
                    self.bans.ban(peer_id, f"bad manifest: {exc}")
                except Exception as exc:
                    logger.info("[%s] manifest from %s failed: %r", self.owner, peer_id.to_base58()[-8:], exc)
            if time.monotonic() > deadline:
                raise WeightsUnavailable(
                    f"no peer served a valid manifest for {pointer.run_id} v{pointer.version}; "
                    "check that the publisher or a holder is online"
                )
            await asyncio.sleep(1.0)

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
        pointer or no manifest can be found, DiskFull if it does not fit on disk.
        """
        validate_run_id(run_id)
        if not self.authorized:
            raise ConfigError("no authorised publishers configured for this run: set authorized_publishers")
        pointer = await self.find_pointer(run_id, version)
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
        lock = self._fetch_locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self.store.get(run_id, pointer.version)
            if entry is not None and entry.manifest.sha256 != pointer.manifest_sha256:
                raise StoreError(
                    f"the store holds a different manifest for {run_id} v{pointer.version} than the publisher's "
                    "pointer; delete that version from the store"
                )
            if entry is None:
                manifest = await self._obtain_manifest(pointer, manifest_timeout_s)
                entry = await asyncio.to_thread(self.store.create, manifest)
            self.service.offer(entry)
            if not entry.complete:
                with contextlib.suppress(Exception):
                    await self._announce_holder(entry)
                fetcher = VersionFetch(
                    p2p=self.p2p,
                    entry=entry,
                    config=self.config,
                    bans=self.bans,
                    own_peer_id=self.peer_id,
                    publisher=PeerID(pointer.publisher),
                    find_holders=lambda: self._holder_ids(pointer),
                    on_chunk=lambda index: self.service.chunk_added(entry, index),
                    on_request=lambda index: self.service.chunk_requested(entry, index),
                    progress=progress,
                    owner=self.owner,
                )
                self.last_fetch = fetcher
                await fetcher.run()
            with contextlib.suppress(Exception):
                await self._announce_holder(entry)
        self._prune(run_id)
        return entry

    async def _holder_ids(self, pointer: WeightsPointer) -> list[PeerID]:
        holders = await self.find_holders(pointer.run_id, pointer.version, pointer.manifest_sha256)
        await asyncio.gather(*(self._dial(h) for h in holders))
        return [h.peer_id for h in holders]

    async def load(self, run_id: str, version: int) -> dict[str, Any]:
        """The state dict of a complete version in the store (torch tensors)."""
        entry = self.store.get(run_id, version)
        if entry is None:
            raise StoreError(f"version {version} of run {run_id} is not in the store; fetch it first")
        return await asyncio.to_thread(entry.load_state_dict)

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
                    pointer = await self.find_pointer(run_id)
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
        pointers: dict[int, WeightsPointer] = {}
        latest = await self.find_pointer(run_id)
        if latest is not None:
            pointers[latest.version] = latest
        for version in self.store.versions(run_id):
            if version not in pointers:
                entry = self.store.get(run_id, version)
                if entry is not None:
                    pointers[version] = entry.manifest.pointer()
        statuses = []
        for version in sorted(pointers):
            pointer = pointers[version]
            entry = self.store.get(run_id, version)
            local = (
                entry.chunks_held
                if entry is not None and entry.manifest.sha256 == pointer.manifest_sha256
                else 0
            )
            statuses.append(
                VersionStatus(
                    version=version,
                    manifest_sha256=pointer.manifest_sha256,
                    publisher=PeerID(pointer.publisher),
                    total_bytes=pointer.total_bytes,
                    num_chunks=pointer.num_chunks,
                    local_chunks=local,
                    holders=await self.find_holders(run_id, version, pointer.manifest_sha256),
                )
            )
        return statuses


__all__ = ["HolderInfo", "VersionStatus", "WeightBroadcast"]
