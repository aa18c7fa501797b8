"""Signed averager declarations: stored signed, read back verified, forgeries skipped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.p2p import PeerID

from node.averaging.declarations import Declarer, SignedGroupKeyManager, read_declarations
from node.dht_node import signing_key_of, start_loopback_dht
from protocol.averager_declaration import AVERAGER_DECLARATION_DOMAIN, declaration_payload
from protocol.dht_keys import signed_subkey
from protocol.envelope import seal
from protocol.peer_keys import peer_id_from_private_key

PREFIX = "declarationtest"
GROUP_KEY = f"{PREFIX}.0b0"


@pytest.fixture(scope="module")
def dht() -> Iterator[DHT]:
    node = start_loopback_dht()
    yield node
    node.shutdown()


def _declarer(dht: DHT) -> Declarer:
    key = signing_key_of(dht)
    assert key is not None, "start_loopback_dht keeps the key of the DHT's PeerID"
    return Declarer(dht, key)


def test_a_declarer_signs_only_as_its_dhts_peer(dht: DHT) -> None:
    with pytest.raises(ValueError, match="not the key"):
        Declarer(dht, Ed25519PrivateKey.generate())


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


def _found(*entries: tuple[str, bytes]) -> SimpleNamespace:
    return SimpleNamespace(value={subkey: SimpleNamespace(value=value) for subkey, value in entries})


def _signed(key: Ed25519PrivateKey, payload: bytes, *, dht_key: str = GROUP_KEY, expires_at: float) -> bytes:
    return seal(
        key,
        domain=AVERAGER_DECLARATION_DOMAIN,
        run_id="",
        dht_key=dht_key,
        expires_at=expires_at,
        seq=1,
        payload=payload,
    )


def test_reading_skips_forgeries_replays_and_unsigned_values() -> None:
    alice, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    alice_id = peer_id_from_private_key(alice)
    alice_subkey = signed_subkey(PeerID(alice_id).to_base58())
    mallory_subkey = signed_subkey(PeerID(peer_id_from_private_key(mallory)).to_base58())
    expires = time.time() + 30
    sharing = declaration_payload(shares_state=True, state_priority=12.0)
    found = _found(
        (alice_subkey, _signed(alice, sharing, expires_at=expires)),
        # Mallory's signature under Alice's name, a declaration signed for another key, an unsigned value
        (mallory_subkey, _signed(alice, sharing, expires_at=expires)),
        (
            signed_subkey("12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"),
            _signed(mallory, sharing, expires_at=expires),
        ),
        (mallory_subkey, _signed(mallory, sharing, dht_key=f"{PREFIX}.0b1", expires_at=expires)),
    )
    found.value[alice_id] = SimpleNamespace(value=7.0)  # what hivemind's own averager would write
    declarations = read_declarations(found, GROUP_KEY)
    assert [(d.peer, d.shares_state, d.state_priority) for d in declarations] == [(alice_id, True, 12.0)]
    assert (
        read_declarations(
            _found((alice_subkey, _signed(alice, sharing, expires_at=time.time() - 5))), GROUP_KEY
        )
        == []
    )
    assert read_declarations(None, GROUP_KEY) == []
