"""The weight broadcast's DHT records: signed weights pointers and holder announcements.

- A **pointer** (`WeightsPointer`) names a version by content id; the publisher keeps one
  under the version's key and, for its newest version of a run, one under the run's `latest` key.
  Only pointers signed by an authorised publisher are believed.
- A **holder announcement** says that a peer holds (part of) a version's content, whoever
  published it, and where it can be dialled; it is a claim, and every chunk is verified on arrival anyway. Reading one dials
  nobody: a fetch dials only the holders it picks (`node.broadcast.dialing`).

`BroadcastRecords` reads both, announces this node's, and keeps them fresh: every third of
the shorter TTL it re-announces each version it holds and each pointer it publishes, so a
version that is dropped lapses from the DHT on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID

from node.broadcast.config import BroadcastConfig
from node.broadcast.store import VersionEntry
from node.log_limit import LogOncePer
from node.signed_records import SignedRecords
from protocol.dht_keys import weights_holders_key, weights_pointer_key, weights_version_key
from protocol.errors import InvalidMessage
from protocol.limits import MAX_ADDRESSES, MAX_HOLDER_TTL_S, MAX_WEIGHTS_POINTER_TTL_S
from protocol.manifest import (
    WEIGHTS_HOLDER_DOMAIN,
    WEIGHTS_POINTER_DOMAIN,
    HolderAnnouncement,
    Manifest,
    WeightsPointer,
)

logger = logging.getLogger(__name__)

_UNAUTHORISED_LOG_INTERVAL_S = 600.0
"""A stale or foreign pointer is looked at on every poll; it is logged once per signer per this long."""

_FORWARD_PROBES = 8
"""Most versions after the one `latest` names that one lookup of the newest follows."""


@dataclass
class HolderInfo:
    """A peer that announced a version in the DHT (its claim; chunks are verified on arrival)."""

    peer_id: PeerID
    chunks_held: int
    num_chunks: int
    addresses: tuple[str, ...] = ()
    attestations: tuple[bytes, ...] = ()
    """Its sealed address attestations (unverified: `node.broadcast.dialing` checks them before dialling)."""


class BroadcastRecords:
    """Finds pointers and holders in the DHT, announces this node's, and refreshes them in the background.

    `held` lists the versions this node serves (announced as a holder); `published` holds the
    manifests whose pointers this node keeps announcing (it is their publisher);
    `own_attestations` gives the address attestations its holder announcements carry.
    """

    def __init__(
        self,
        *,
        signed: SignedRecords,
        p2p: P2P,
        config: BroadcastConfig,
        authorized: set[bytes],
        held: Callable[[], list[VersionEntry]],
        owner: str = "",
        own_attestations: Callable[[], tuple[bytes, ...]] = tuple,
    ) -> None:
        self.signed = signed
        self.p2p = p2p
        self.config = config
        self.authorized = authorized
        self.held = held
        self.owner = owner
        self.own_attestations = own_attestations
        self.peer_id = signed.identity.peer_id
        self.published: dict[tuple[str, int], Manifest] = {}
        self._announcer: asyncio.Task[None] | None = None
        self._addresses: tuple[str, ...] | None = None
        self._newest_seen: dict[str, WeightsPointer] = {}
        """Per run, the newest authorised pointer found so far."""
        self._unauthorised_logged = LogOncePer(_UNAUTHORISED_LOG_INTERVAL_S)

    # ---- reading -------------------------------------------------------------------------

    async def find_pointer(self, run_id: str, version: int | None = None) -> WeightsPointer | None:
        """The authorised pointer to `version`, or to the newest version when None; None if there is none.

        The newest never goes back: a captured older pointer re-stored under `latest` (or the newer
        one hidden) cannot roll a node back below a version it has seen, holds or published, and
        the versions right after the one `latest` names are looked up under their own keys, so a
        rolled-back `latest` does not mislead a new joiner either while versions follow one another.
        """
        if version is not None:
            found = await self._find_at(weights_version_key(run_id, version), run_id, version)
        else:
            found = await self._find_at(weights_pointer_key(run_id), run_id, None)
            known = self._newest_known(run_id)
            if known is not None and (found is None or known.version > found.version):
                found = known
            for _ in range(_FORWARD_PROBES):
                if found is None:
                    break
                following = await self._find_at(
                    weights_version_key(run_id, found.version + 1), run_id, found.version + 1
                )
                if following is None:
                    break
                found = following
        if found is not None:
            newest = self._newest_seen.get(run_id)
            if newest is None or found.version > newest.version:
                self._newest_seen[run_id] = found
        return found

    def _newest_known(self, run_id: str) -> WeightsPointer | None:
        """The newest authorised pointer of `run_id` this node has seen, holds or published."""
        known = [pointer for pointer in (self._newest_seen.get(run_id),) if pointer is not None]
        known += [e.manifest.pointer() for e in self.held() if e.run_id == run_id]
        known += [m.pointer() for (run, _), m in self.published.items() if run == run_id]
        known = [p for p in known if p.publisher in self.authorized]
        return max(known, key=lambda p: (p.version, p.publisher), default=None)

    async def _find_at(self, key: str, run_id: str, version: int | None) -> WeightsPointer | None:
        """The authorised pointer under `key` with the highest version (to `version` only, if given)."""
        best: WeightsPointer | None = None
        values = await self.signed.get(
            key, domain=WEIGHTS_POINTER_DOMAIN, run_id=run_id, max_ttl_s=MAX_WEIGHTS_POINTER_TTL_S
        )
        for value in values:
            try:
                pointer = WeightsPointer.from_payload(value.payload)
            except InvalidMessage:
                continue
            if pointer.publisher != value.signer or pointer.run_id != run_id:
                continue
            if value.signer not in self.authorized:
                if self._unauthorised_logged(
                    value.signer
                ):  # anyone can store one: a line per signer per interval
                    logger.info(
                        "[%s] ignoring weights pointer from unauthorised %s (said once per %.0f min)",
                        self.owner,
                        PeerID(value.signer),
                        _UNAUTHORISED_LOG_INTERVAL_S / 60,
                    )
                continue
            if version is not None and pointer.version != version:
                continue
            if best is None or (pointer.version, pointer.publisher) > (best.version, best.publisher):
                best = pointer
        return best

    async def find_holders(self, run_id: str, version: int, content_id: bytes) -> list[HolderInfo]:
        """Peers that announced `version` with this content in the DHT (whichever publisher's manifest they hold)."""
        key = weights_holders_key(run_id, version)
        holders = []
        values = await self.signed.get(
            key, domain=WEIGHTS_HOLDER_DOMAIN, run_id=run_id, max_ttl_s=MAX_HOLDER_TTL_S
        )
        for value in values:
            try:
                announcement = HolderAnnouncement.from_payload(value.payload)
            except InvalidMessage:
                continue
            if announcement.version != version or announcement.content_id != content_id:
                continue
            holders.append(
                HolderInfo(
                    PeerID(value.signer),
                    announcement.chunks_held,
                    announcement.num_chunks,
                    announcement.addresses,
                    announcement.attestations,
                )
            )
        return holders

    # ---- announcing ----------------------------------------------------------------------

    async def announce_holder(self, entry: VersionEntry) -> None:
        """Announce that this node holds `entry` (as many chunks as it has now)."""
        announcement = HolderAnnouncement(
            run_id=entry.run_id,
            version=entry.version,
            content_id=entry.manifest.content_id,
            chunks_held=entry.chunks_held,
            num_chunks=entry.manifest.num_chunks,
            addresses=await self.own_addresses(),
            attestations=self.own_attestations(),
        )
        await self.signed.store(
            weights_holders_key(entry.run_id, entry.version),
            domain=WEIGHTS_HOLDER_DOMAIN,
            run_id=entry.run_id,
            payload=announcement.to_payload(),
            ttl_s=self.config.holder_ttl_s,
        )

    async def announce_pointer(self, manifest: Manifest) -> None:
        """Store the pointer to a published version, also as the run's `latest` if it is our newest."""
        newest = max(version for (run_id, version) in self.published if run_id == manifest.run_id)
        payload = manifest.pointer().to_payload()
        keys = [weights_version_key(manifest.run_id, manifest.version)]
        if manifest.version == newest:
            keys.append(weights_pointer_key(manifest.run_id))
        for key in keys:
            await self.signed.store(
                key,
                domain=WEIGHTS_POINTER_DOMAIN,
                run_id=manifest.run_id,
                payload=payload,
                ttl_s=self.config.pointer_ttl_s,
            )

    async def own_addresses(self) -> tuple[str, ...]:
        """This node's announced addresses (its p2pd's visible ones, no relays)."""
        if self._addresses is None:
            try:
                maddrs = await self.p2p.get_visible_maddrs()
            except Exception:
                return ()
            own = f"/p2p/{self.peer_id.to_base58()}"
            cleaned = {str(m).removesuffix(own) for m in maddrs if "p2p-circuit" not in str(m)}
            self._addresses = tuple(sorted(cleaned))[:MAX_ADDRESSES]
        return self._addresses

    async def announce_all(self) -> None:
        """Refresh every holder announcement and every published pointer (failures are retried next time)."""
        for entry in self.held():
            with contextlib.suppress(Exception):
                await self.announce_holder(entry)
        for manifest in list(self.published.values()):
            with contextlib.suppress(Exception):
                await self.announce_pointer(manifest)

    def start_announcing(self) -> None:
        """Refresh the records every third of the shorter TTL until `stop_announcing`."""
        if self._announcer is None:
            self._announcer = asyncio.create_task(self._announce_loop())

    async def stop_announcing(self) -> None:
        if self._announcer is not None:
            self._announcer.cancel()
            await asyncio.gather(self._announcer, return_exceptions=True)
            self._announcer = None

    async def _announce_loop(self) -> None:
        interval = min(self.config.holder_ttl_s, self.config.pointer_ttl_s) / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.announce_all()
            except Exception as exc:
                logger.info("[%s] announcing failed: %r", self.owner, exc)


__all__ = ["BroadcastRecords", "HolderInfo"]
