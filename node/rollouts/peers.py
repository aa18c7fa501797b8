"""How the rollout transport reaches peers: its own P2P replica, and dialling members by their own record.

Workers, validators and trainers name each other by PeerID. The only addresses ever dialled are
those a peer signed itself in its node record, found through membership (`node.membership`):
never an address that arrived inside a submission or a forward. Even those are dialled within the
limits of `node.broadcast.dialing.HolderDialer`: a signed record may list anyone's addresses, so
only a few of them are dialled, at public IPs unless the swarm is on loopback only, and there only
those that one of this node's seeds attested (the record carries the attestations), each rarely
and with back-off, and not at all while the peer is connected.
"""

from __future__ import annotations

import hivemind
from hivemind.p2p import P2P

from node.broadcast.dialing import HolderDialer
from node.broadcast.records import HolderInfo
from node.membership import LiveNode
from node.runtime import in_dht

__all__ = ["connect_member", "member_holder", "own_record_addresses", "replicate_p2p"]


async def replicate_p2p(dht: hivemind.DHT) -> P2P:
    """A P2P client of `dht`'s daemon bound to the running event loop (hivemind's cached one is bound
    to the first loop that made it); shut it down when done."""
    return await P2P.replicate(await in_dht(dht, hivemind.DHT._get_p2p_daemon_listen_maddr))


def own_record_addresses(member: LiveNode) -> tuple[str, ...]:
    """The addresses of `member`'s signed record, without the `/p2p/<its PeerID>` ending (an address
    that names another peer is dropped)."""
    own = f"/p2p/{member.peer_id.to_base58()}"
    return tuple(a.removesuffix(own) for a in member.record.addresses if "/p2p/" not in a.removesuffix(own))


def member_holder(member: LiveNode) -> HolderInfo:
    """What the dialler needs of `member`: its record's addresses and address attestations."""
    return HolderInfo(member.peer_id, 0, 0, own_record_addresses(member), member.record.attestations)


async def connect_member(dialer: HolderDialer, member: LiveNode) -> None:
    """Make the daemon able to reach `member` at the addresses of its own signed record, within the
    dialler's limits (a failure shows in the exchange that follows)."""
    await dialer.dial(member_holder(member))
