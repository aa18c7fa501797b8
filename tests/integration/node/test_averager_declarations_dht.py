"""Signed averager declarations on a real DHT: stored signed, read back verified, signed only as the DHT's peer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.p2p import PeerID

from node.averaging.declarations import Declarer, SignedGroupKeyManager
from node.dht_node import signing_key_of, start_loopback_dht

PREFIX = "declarationtest"
GROUP_KEY = f"{PREFIX}.0b0"


def test_a_declarer_signs_only_as_its_dhts_peer(dht: DHT) -> None:
    with pytest.raises(ValueError, match="not the key"):
        Declarer(dht, Ed25519PrivateKey.generate())


@pytest.fixture(scope="module")
def dht() -> Iterator[DHT]:
    node = start_loopback_dht()
    yield node
    node.shutdown()


def _declarer(dht: DHT) -> Declarer:
    key = signing_key_of(dht)
    assert key is not None, "start_loopback_dht keeps the key of the DHT's PeerID"
    return Declarer(dht, key)


def test_joining_and_leaving_a_group_read_back_verified(dht: DHT) -> None:
    declarer = _declarer(dht)
    manager = SignedGroupKeyManager(GroupKeyManager(dht, PREFIX, "0", None), declarer)
    expiration = time.time() + 30

    async def scenario() -> tuple[list, list, list]:
        assert await manager.declare_averager(GROUP_KEY, declarer.peer_id, expiration)
        joined = await manager.get_averagers(GROUP_KEY, only_active=True)
        assert await manager.declare_averager(
            GROUP_KEY, declarer.peer_id, expiration, looking_for_group=False
        )
        return (
            joined,
            await manager.get_averagers(GROUP_KEY, True),
            await manager.get_averagers(GROUP_KEY, False),
        )

    joined, active_after, all_after = asyncio.run(scenario())
    assert joined == [(declarer.peer_id, pytest.approx(expiration))]
    assert active_after == []  # the leave replaced the join (it expires just after it)
    assert [peer for peer, _ in all_after] == [declarer.peer_id]
    with pytest.raises(ValueError, match="declares itself only"):
        asyncio.run(manager.declare_averager(GROUP_KEY, PeerID(b"\x00\x02ab"), expiration))
