"""The receipts a node signs for the seeds that served it: a bootstrap, a reachability dial-back.

Seeds serve work no averaging round or transfer records: they answer newcomers' bootstraps and
dial them back to test their reachability. As for every receipt, the node that received the
service signs it, never the seed: one `SEED_SERVICE_BOOTSTRAP` receipt per seed whose connection
and DHT ping really succeeded at start-up (`node.dht_node.bootstrap`), and one
`SEED_SERVICE_DIAL_BACK` receipt for the seed that reached it back (`node.reachability`). The seed
is named by the PeerID of the `/p2p/` part of the address this node dialled; each receipt carries a
random session id as its evidence. A node never signs one for itself (its own address may be among
its initial peers), and at most one per seed per bootstrap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from hivemind.p2p import PeerID
from multiaddr import Multiaddr

from node.identity import Identity
from protocol import receipts_pb2
from protocol.receipts import MIN_SESSION_ID_BYTES, seal_seed_receipt


def seed_peer_id(address: str) -> bytes | None:
    """The PeerID bytes of the `/p2p/` part of a seed's multiaddr (None if it has none)."""
    try:
        return PeerID.from_base58(Multiaddr(address)["p2p"]).to_bytes()
    except Exception:
        return None


def seed_receipt(identity: Identity, run_id: str, seed: bytes, service: receipts_pb2.SeedService) -> bytes:
    """A receipt signed by `identity` for one `service` that `seed` gave it, in a new session."""
    return seal_seed_receipt(
        identity.private_key,
        run_id=run_id,
        contributor=seed,
        service=service,
        session_id=os.urandom(MIN_SESSION_ID_BYTES),
    )


def bootstrap_receipts(identity: Identity, run_id: str, answered: Iterable[str]) -> list[bytes]:
    """One bootstrap receipt per distinct seed among the addresses that `answered` (not this node)."""
    own = identity.peer_id_bytes
    seeds: list[bytes] = []
    for address in answered:
        seed = seed_peer_id(address)
        if seed is not None and seed != own and seed not in seeds:
            seeds.append(seed)
    return [seed_receipt(identity, run_id, seed, receipts_pb2.SEED_SERVICE_BOOTSTRAP) for seed in seeds]


def dial_back_receipt(identity: Identity, run_id: str, seed: bytes) -> bytes | None:
    """The receipt for the seed that dialled this node back (None if that would be itself)."""
    if seed == identity.peer_id_bytes:
        return None
    return seed_receipt(identity, run_id, seed, receipts_pb2.SEED_SERVICE_DIAL_BACK)
