"""How the rollout transport reaches peers: its own P2P replica, and dialling members by their own record.

Workers, validators and trainers name each other by PeerID. The only addresses ever dialled are
those a peer signed itself in its node record, found through membership (`node.membership`):
never an address that arrived inside a submission or a forward.
"""

from __future__ import annotations

import asyncio
import contextlib

import hivemind
from hivemind.p2p import P2P
from multiaddr import Multiaddr

from node.membership import LiveNode
from node.runtime import in_dht


async def replicate_p2p(dht: hivemind.DHT) -> P2P:
    """A P2P client of `dht`'s daemon bound to the running event loop (hivemind's cached one is bound
    to the first loop that made it); shut it down when done."""
    return await P2P.replicate(await in_dht(dht, hivemind.DHT._get_p2p_daemon_listen_maddr))


async def connect_member(p2p: P2P, member: LiveNode, timeout_s: float = 10.0) -> bool:
    """Make the daemon reach `member` at the addresses of its own signed record; False if it could not."""
    addresses = []
    for address in member.record.addresses:
        with contextlib.suppress(Exception):
            addresses.append(Multiaddr(address))
    if not addresses:
        return False
    try:
        await asyncio.wait_for(p2p._client.connect(member.peer_id, addresses), timeout_s)
    except Exception:
        return False
    return True
