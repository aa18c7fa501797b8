"""Dialling holders and members: only those picked for work, only at addresses proven to be theirs.

A holder announcement or node record names the addresses its signer says it listens on; the signer
alone cannot prove they are its own, and a connection attempt reaches whoever listens there before
libp2p's handshake finds the wrong key. So announced addresses are dialled sparingly (issue 12,
#30 item 6):

- only when a fetch picks the holder as a source (`HolderDialer.dial`), never on discovery (the
  rollout transport and the receipts exchange dial the members they picked, likewise);
- not at all while p2pd is already connected to the holder;
- in a public swarm, only an address that an unexpired attestation names for that PeerID, signed
  by one of this node's trusted attesters (its own seeds, `trusted_attesters`): a seed signs one
  when its dial-back probe reached the peer there (`protocol.address_attestation`,
  `node.reachability`), and the peer carries it in its record and announcements (`HolderInfo`);
- only plain `/ip4|ip6/<ip>/tcp|udp/...` addresses, at a public IP unless this node itself
  listens only on loopback (a local test swarm, where nothing needs an attestation either), the
  first few dialable ones of a holder (never the rest of a long list), and never an address that
  p2pd is connected to as another peer's;
- each address at most once per `ADDRESS_REDIAL_S`, whichever holder names it, and after a
  failed dial not again for a period that doubles up to `ADDRESS_BACKOFF_MAX_S`: five
  throwaway identities naming one third-party address cost it one connection attempt, not five
  every half minute.

How many holders a fetch considers per refresh is capped by `max_holders_considered` (see
`sample_holders`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from collections.abc import Awaitable, Callable, Collection, Sequence

from hivemind.p2p import P2P, PeerID
from multiaddr import Multiaddr

from node.broadcast.records import HolderInfo
from node.dialable import IPNetwork, is_dialable_ip
from protocol.address_attestation import MAX_ATTESTATIONS, open_attestation
from protocol.errors import InvalidMessage

ADDRESS_REDIAL_S = 30.0
ADDRESS_BACKOFF_S = 60.0
ADDRESS_BACKOFF_MAX_S = 3600.0
MAX_ADDRESSES_PER_DIAL = 4
DIAL_TIMEOUT_S = 5.0
_MAX_REMEMBERED_ADDRESSES = 4096
_IP_PROTOCOLS = ("ip4", "ip6")
_TRANSPORTS = ("tcp", "udp")


def sample_holders(
    holders: Sequence[HolderInfo], limit: int, skip: Callable[[HolderInfo], bool], rng: random.Random
) -> list[HolderInfo]:
    """At most `limit` of `holders` (a random sample of those `skip` does not exclude)."""
    candidates = [h for h in holders if not skip(h)]
    return rng.sample(candidates, limit) if len(candidates) > limit else candidates


def address_ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP of a plain `/ip4|ip6/<ip>/tcp|udp/<port>[/quic...]` multiaddr; None for anything else
    (relays, PeerIDs, DNS names, malformed text)."""
    try:
        maddr = Multiaddr(address)
        names = [proto.name for proto in maddr.protocols()]
        if len(names) < 2 or names[0] not in _IP_PROTOCOLS or names[1] not in _TRANSPORTS:
            return None
        if any(name not in (*_IP_PROTOCOLS, *_TRANSPORTS, "quic", "quic-v1") for name in names):
            return None
        return ipaddress.ip_address(maddr.value_for_protocol(names[0]))
    except Exception:
        return None


def dialable(address: str, *, allow_private: bool, networks: Collection[IPNetwork] = ()) -> str | None:
    """The address in canonical form if it may be dialled (see `address_ip`; a public IP or one in
    the operator's dialable `networks`, unless `allow_private`), else None."""
    ip = address_ip(address)
    if ip is None or not (allow_private or is_dialable_ip(ip, networks)):
        return None
    return str(Multiaddr(address))


class HolderDialer:
    """Tells p2pd how to reach holders this node picked as sources, within the limits above.

    `trusted_attesters`: the PeerIDs (bytes) whose address attestations this node believes, its
    own initial peers' (`node.attestations.trusted_attesters`); with none, a public swarm's peers
    are dialled at no address at all."""

    def __init__(
        self,
        p2p: P2P,
        own_peer_id: PeerID,
        own_addresses: Callable[[], Awaitable[tuple[str, ...]]],
        trusted_attesters: Collection[bytes] = frozenset(),
        *,
        networks: Collection[IPNetwork] = (),
    ) -> None:
        self.p2p = p2p
        self.networks = tuple(networks)
        self.own_peer_id = own_peer_id
        self.own_addresses = own_addresses
        self.trusted_attesters = frozenset(trusted_attesters)
        self.unattested = 0
        """Addresses left undialled in a public swarm for want of a trusted attestation."""
        self.attempts = 0
        """Dials made (each to up to `MAX_ADDRESSES_PER_DIAL` addresses of one holder)."""
        self.finished = 0
        """Of those, the ones that have ended (connected, failed or timed out)."""
        self._next_dial: dict[str, float] = {}
        """Per address: when it may be dialled again."""
        self._backoff: dict[str, float] = {}
        """Per address that failed: the current back-off period."""

    async def _allow_private(self) -> bool:
        """Private and loopback addresses are dialled only in a local swarm (this node only on loopback)."""
        ips = [address_ip(a) for a in await self.own_addresses()]
        return bool(ips) and all(ip is not None and ip.is_loopback for ip in ips)

    async def dial(self, holder: HolderInfo) -> None:
        """Make sure p2pd can reach `holder` (call only for a holder picked as a source)."""
        if holder.peer_id == self.own_peer_id or not holder.addresses:
            return
        allow_private = await self._allow_private()
        # a local swarm (all on loopback) has no seed outside to prove anything: no attestation needed
        attested = None if allow_private else self.attested_addresses(holder)
        now = time.monotonic()
        candidates = []
        for address in holder.addresses:
            canonical = dialable(address, allow_private=allow_private, networks=self.networks)
            if canonical is None or canonical in candidates:
                continue
            if attested is not None and canonical not in attested:
                self.unattested += 1
                continue
            candidates.append(canonical)
        # the first few of a record only: the next dial must not walk on through the rest of a long
        # list while the first ones back off
        candidates = candidates[:MAX_ADDRESSES_PER_DIAL]
        targets = [a for a in candidates if self._next_dial.get(a, 0.0) <= now]
        if not targets:
            return
        try:
            connected = await self.p2p.list_peers()
        except Exception:
            return
        if any(info.peer_id == holder.peer_id for info in connected):
            return
        others = {str(addr) for info in connected for addr in info.addrs}
        now = time.monotonic()
        # re-checked after the await: concurrent dials of holders naming the same address dial it once
        targets = [a for a in targets if a not in others and self._next_dial.get(a, 0.0) <= now]
        if not targets:
            return
        for address in targets:
            self._next_dial[address] = now + max(ADDRESS_REDIAL_S, self._backoff.get(address, 0.0))
        self.attempts += 1
        try:
            connected_now = await self._connect(holder.peer_id, targets)
        finally:
            self.finished += 1
        if connected_now:
            for address in targets:
                self._backoff.pop(address, None)
        else:
            now = time.monotonic()
            for address in targets:
                period = min(ADDRESS_BACKOFF_MAX_S, 2 * self._backoff.get(address, ADDRESS_BACKOFF_S / 2))
                self._backoff[address] = period
                self._next_dial[address] = now + period
        self._forget_old(time.monotonic())

    def attested_addresses(self, holder: HolderInfo) -> set[str]:
        """The addresses of `holder` that an unexpired attestation by a trusted attester names."""
        if not self.trusted_attesters:
            return set()
        subject = holder.peer_id.to_bytes()
        attested: set[str] = set()
        for sealed in holder.attestations[:MAX_ATTESTATIONS]:
            try:
                attestation = open_attestation(sealed, subject=subject, signers=self.trusted_attesters)
            except InvalidMessage:
                continue
            attested.update(attestation.addresses)
        return attested

    async def _connect(self, peer_id: PeerID, addresses: list[str]) -> bool:
        """Whether p2pd connected to `peer_id` at one of `addresses` within `DIAL_TIMEOUT_S`."""
        try:
            await asyncio.wait_for(
                self.p2p._client.connect(peer_id, [Multiaddr(a) for a in addresses]), timeout=DIAL_TIMEOUT_S
            )
        except Exception:
            return False
        return True

    def _forget_old(self, now: float) -> None:
        if len(self._next_dial) <= _MAX_REMEMBERED_ADDRESSES:
            return
        for address in [a for a, at in self._next_dial.items() if at <= now]:
            del self._next_dial[address]
            self._backoff.pop(address, None)
        while len(self._next_dial) > _MAX_REMEMBERED_ADDRESSES:  # all still blocked: drop the soonest free
            address = min(self._next_dial, key=self._next_dial.__getitem__)
            del self._next_dial[address]
            self._backoff.pop(address, None)
