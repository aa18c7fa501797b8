"""Asking seeds whether they can call this node back (used by `hivenet doctor`).

hivemind's validated ping makes the remote peer ping us back before it answers; the answer's
`available` flag says whether that worked. libp2p may reuse the connection we opened, so a
success proves that this node serves requests, while a failure reliably means peers cannot
reach it (firewall, NAT without relay, wrong announced address).
"""

from __future__ import annotations

import hivemind
from hivemind.dht.node import DHTNode
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from multiaddr import Multiaddr

_DIAL_BACK_TIMEOUT_S = 10.0


async def ask_dial_back(_dht: hivemind.DHT, node: DHTNode, seeds: list[str]) -> bool:
    """True if any of `seeds` (full multiaddrs) confirms it could call this node back."""
    for seed in seeds:
        peer_id = PeerID.from_base58(Multiaddr(seed)["p2p"])
        request = dht_pb2.PingRequest(peer=node.protocol.node_info, validate=True)
        try:
            response = await node.protocol.get_stub(peer_id).rpc_ping(request, timeout=_DIAL_BACK_TIMEOUT_S)
        except Exception:
            continue
        if response.available:
            return True
    return False
