"""This node's address attestations: whose it trusts, the ones its seeds gave it, and their renewal.

- **Trusted attesters** are the PeerIDs of the node's own initial peers (the `/p2p/` part of each):
  the seeds it chose to join through. In a public swarm it dials an address of another peer's record
  only if one of them attested it (`node.broadcast.dialing.HolderDialer`).
- **Its own attestations** come from the seeds that dialled it back (`node.reachability`): the
  newest of each seed, for at most `MAX_ATTESTATIONS` seeds, the longest-lived kept. The node
  publishes them in its record (`node.membership.Membership`) and holder announcements.
- **Renewal**: an attestation lasts `ATTESTATION_TTL_S`; once a node has checked its reachability,
  `AttestationRenewal` re-checks every `RENEW_INTERVAL_S`, asking first the seed whose attestation
  lapses soonest (or that gave none), so that a node with two or three seeds keeps one of each
  without asking any seed more than once per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable

from node.dialable import IPNetwork
from node.receipts.seeds import seed_peer_id
from protocol.address_attestation import MAX_ATTESTATIONS, AddressAttestation, open_attestation
from protocol.errors import InvalidMessage

logger = logging.getLogger(__name__)

RENEW_INTERVAL_S = 900.0
"""How often a node re-checks its reachability to renew its attestations (a quarter of their life)."""


def trusted_attesters(initial_peers: Iterable[str]) -> frozenset[bytes]:
    """The PeerIDs (bytes) named by the `/p2p/` parts of `initial_peers`."""
    return frozenset(peer for peer in map(seed_peer_id, initial_peers) if peer is not None)


class AttestationBook:
    """The attesters this node trusts, and the newest valid attestation each of its seeds gave it.
    Thread-safe: the node's loop and its callers' threads use it."""

    def __init__(
        self, own_peer_id: bytes, trusted: Iterable[bytes] = (), dialable_networks: Iterable[IPNetwork] = ()
    ) -> None:
        self.own_peer_id = own_peer_id
        self.trusted: frozenset[bytes] = frozenset(trusted)
        """PeerIDs whose attestations of other peers' addresses this node believes."""
        self.dialable_networks: tuple[IPNetwork, ...] = tuple(dialable_networks)
        """Private networks whose (attested) addresses this node dials like public ones (`node.dialable`)."""
        self._held: dict[bytes, AddressAttestation] = {}
        self._lock = threading.Lock()

    def add(self, sealed: bytes, now: float | None = None) -> bool:
        """Keep `sealed` if it is a valid attestation about this node, newer than its signer's last."""
        try:
            attestation = open_attestation(sealed, subject=self.own_peer_id, now=now)
        except InvalidMessage as exc:
            logger.info("ignoring an invalid address attestation: %s", exc)
            return False
        with self._lock:
            self._drop_expired(time.time() if now is None else now)
            last = self._held.get(attestation.signer)
            if last is not None and last.expires_at >= attestation.expires_at:
                return False
            self._held[attestation.signer] = attestation
            while len(self._held) > MAX_ATTESTATIONS:  # the one that lapses first goes
                del self._held[min(self._held, key=lambda signer: self._held[signer].expires_at)]
        return True

    def current(self, now: float | None = None) -> tuple[bytes, ...]:
        """The sealed attestations still valid, longest-lived first (what the node publishes)."""
        with self._lock:
            self._drop_expired(time.time() if now is None else now)
            held = sorted(self._held.values(), key=lambda a: a.expires_at, reverse=True)
        return tuple(a.sealed for a in held)

    def renewal_order(self, seeds: list[str]) -> list[str]:
        """`seeds` (multiaddrs), those without an attestation first, then the soonest to lapse first."""
        with self._lock:
            expiry = {signer: a.expires_at for signer, a in self._held.items()}
        return sorted(seeds, key=lambda seed: expiry.get(seed_peer_id(seed) or b"", 0.0))

    def _drop_expired(self, now: float) -> None:
        for signer in [s for s, a in self._held.items() if a.expires_at < now]:
            del self._held[signer]


class AttestationRenewal:
    """A node service that runs `check` (a reachability check) every `interval_s`."""

    name = "attestation-renewal"

    def __init__(self, check: Callable[[], Awaitable[object]], interval_s: float = RENEW_INTERVAL_S) -> None:
        self.check = check
        self.interval_s = interval_s
        self.renewals = 0
        """Checks run so far."""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="attestation-renewal")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:  # no seed answered in time, or the DHT is shutting down
                logger.info("re-checking reachability failed: %r", exc)
            self.renewals += 1
