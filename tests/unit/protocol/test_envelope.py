"""Signed envelopes: round trip, and each way a forged or replayed one is refused."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import hivenet_pb2 as pb
from protocol.envelope import open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.peer_keys import check_ed25519_peer_id, peer_id_from_private_key, signature_verifies


def _seal(key: Ed25519PrivateKey, **overrides: object) -> bytes:
    args: dict = dict(
        domain="node-record", run_id="r1", payload=b"hello", expires_at=time.time() + 60, seq=1, dht_key="k"
    )
    args.update(overrides)
    return seal(key, **args)  # type: ignore[arg-type]


def test_round_trip_and_peer_id_inlines_public_key() -> None:
    key = Ed25519PrivateKey.generate()
    envelope = open_envelope(_seal(key), domain="node-record", run_id="r1", dht_key="k")
    assert envelope.payload == b"hello"
    assert envelope.signer == peer_id_from_private_key(key)
    assert signature_verifies(envelope.signer, key.sign(b"x"), b"x")


@pytest.mark.parametrize("peer_id", [bytearray(38), 5, None, b"", b"\x00\x03abc"])
def test_a_peer_id_that_is_not_bytes_of_an_ed25519_key_is_refused_every_time(peer_id: object) -> None:
    for _ in range(2):  # a refusal is not cached: the second call checks again and refuses again
        with pytest.raises(InvalidMessage):
            check_ed25519_peer_id(peer_id)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("check", "match"),
    [
        (dict(domain="manifest"), "expected 'manifest'"),
        (dict(run_id="other"), "run"),
        (dict(dht_key="other"), "another DHT key"),
        (dict(max_ttl_s=1.0), "beyond"),
    ],
)
def test_context_mismatch_is_refused(check: dict, match: str) -> None:
    key = Ed25519PrivateKey.generate()
    kwargs: dict = dict(domain="node-record", run_id="r1", dht_key="k")
    kwargs.update(check)
    with pytest.raises(InvalidMessage, match=match):
        open_envelope(_seal(key, expires_at=time.time() + 3600), **kwargs)


def test_tampered_body_and_foreign_signer_are_refused() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    sealed = pb.SignedEnvelope.FromString(_seal(key))
    body = pb.EnvelopeBody.FromString(sealed.body)
    body.payload = b"evil"
    forged = pb.SignedEnvelope(body=body.SerializeToString(), signature=sealed.signature).SerializeToString()
    with pytest.raises(InvalidMessage, match="signature"):
        open_envelope(forged, domain="node-record")
    with pytest.raises(InvalidMessage, match="another peer"):
        open_envelope(_seal(key), domain="node-record", signer=peer_id_from_private_key(other))


def test_expired_and_malformed_are_refused() -> None:
    key = Ed25519PrivateKey.generate()
    with pytest.raises(InvalidMessage, match="expired"):
        open_envelope(_seal(key, expires_at=time.time() - 3600), domain="node-record")
    for junk in (b"\xff\xff\xff", b"", "text", 42, None, b"x" * 100_000):
        with pytest.raises(InvalidMessage):
            open_envelope(junk, domain="node-record")
