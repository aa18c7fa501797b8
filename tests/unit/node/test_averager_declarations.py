"""Signed averager declarations read back from a lookup: forgeries, replays and unsigned values skipped."""

from __future__ import annotations

import time
from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import PeerID

from node.averaging.declarations import read_declarations
from protocol.averager_declaration import AVERAGER_DECLARATION_DOMAIN, declaration_payload
from protocol.dht_keys import signed_subkey
from protocol.envelope import seal
from protocol.peer_keys import peer_id_from_private_key

PREFIX = "declarationtest"
GROUP_KEY = f"{PREFIX}.0b0"


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
