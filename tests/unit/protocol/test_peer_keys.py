"""Ed25519 PeerIDs and signature checks: what `cryptography` signs verifies, anything else does not."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.proto import crypto_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import hivenet_pb2 as pb
from protocol.envelope import SIGNATURE_CONTEXT, open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.peer_keys import Signer, check_ed25519_peer_id, peer_id_from_private_key, signature_verifies
from protocol.version import PROTOCOL_VERSION

_KEY = Ed25519PrivateKey.generate()
_PEER = peer_id_from_private_key(_KEY)


def _peer_id_of_raw_key(raw: bytes) -> bytes:
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.KeyType.Ed25519, data=raw).SerializeToString()
    return bytes([0, len(encoded)]) + encoded


@settings(max_examples=200, deadline=None)
@given(message=st.binary(max_size=2048), flip=st.integers(min_value=0))
def test_what_cryptography_signs_verifies_and_one_flipped_bit_does_not(message: bytes, flip: int) -> None:
    signature = _KEY.sign(message)
    assert signature_verifies(_PEER, signature, message)
    bit = flip % (8 * len(signature))
    forged = bytearray(signature)
    forged[bit // 8] ^= 1 << (bit % 8)
    assert not signature_verifies(_PEER, bytes(forged), message)
    if message:
        altered = bytearray(message)
        altered[flip % len(message)] ^= 1
        assert not signature_verifies(_PEER, signature, bytes(altered))


@pytest.mark.parametrize("signature", [b"", bytes(63), bytes(65), "x" * 64, None])
def test_a_malformed_signature_is_just_invalid(signature: object) -> None:
    assert not signature_verifies(_PEER, signature, b"message")  # type: ignore[arg-type]


@pytest.mark.parametrize("peer_id", [bytearray(38), 5, None, b"", b"\x00\x03abc"])
def test_a_peer_id_that_cannot_sign_is_refused(peer_id: object) -> None:
    with pytest.raises(InvalidMessage):
        check_ed25519_peer_id(peer_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage):
        signature_verifies(peer_id, bytes(64), b"message")  # type: ignore[arg-type]
    assert check_ed25519_peer_id(_PEER) == _PEER


def test_a_small_order_key_has_no_signature_that_verifies_every_message() -> None:
    """The identity point as a public key, with R = identity and S = 0, "signs" any message under
    OpenSSL's verify, so anyone could forge that PeerID's envelopes (accepted before libsodium)."""
    identity_point = bytes([1]) + bytes(31)
    peer = _peer_id_of_raw_key(identity_point)
    universal = identity_point + bytes(32)
    assert not signature_verifies(peer, universal, b"any message")
    body = pb.EnvelopeBody(
        domain="node-record",
        protocol_version=PROTOCOL_VERSION,
        run_id="r1",
        dht_key="k",
        expires_at=time.time() + 60,
        seq=1,
        signer=peer,
        payload=b"forged",
    ).SerializeToString()
    assert not signature_verifies(peer, universal, SIGNATURE_CONTEXT + body)
    forged = pb.SignedEnvelope(body=body, signature=universal).SerializeToString()
    with pytest.raises(InvalidMessage, match="does not verify"):
        open_envelope(forged, domain="node-record", run_id="r1", dht_key="k")


@settings(max_examples=100, deadline=None)
@given(message=st.binary(max_size=2048))
def test_a_signer_makes_the_very_signatures_and_envelopes_of_its_private_key(message: bytes) -> None:
    signer = Signer(_KEY)
    assert signer.peer_id == _PEER
    assert signer.sign(message) == _KEY.sign(message)
    expires_at = time.time() + 60
    assert seal(signer, domain="test", run_id="run", payload=message, expires_at=expires_at, seq=7) == seal(
        _KEY, domain="test", run_id="run", payload=message, expires_at=expires_at, seq=7
    )
