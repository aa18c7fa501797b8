"""Unit tests of the signed manifest, the DHT pointer and holder records, and bitmaps (no network)."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from protocol import broadcast_pb2 as bpb
from protocol.chunk_bitmap import parse_bitmap
from protocol.dht_keys import signed_subkey, weights_holders_key, weights_pointer_key
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.manifest import (
    MANIFEST_CONTEXT,
    WEIGHTS_HOLDER_DOMAIN,
    WEIGHTS_POINTER_DOMAIN,
    HolderAnnouncement,
    Manifest,
    TensorInfo,
    UnauthorizedPublisher,
    WeightsPointer,
    build_manifest,
    content_id_of,
    parse_manifest,
    sha256,
)
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator

CHUNK = 4096


def _manifest(
    key: Ed25519PrivateKey,
    data: bytes,
    run_id: str = "run",
    version: int = 3,
    *,
    created_at: float | None = None,
    tensors: tuple[TensorInfo, ...] = (TensorInfo("w", "F32", (2, 3), 100, 124),),
) -> Manifest:
    hashes = b"".join(sha256(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK))
    return build_manifest(
        key,
        run_id=run_id,
        version=version,
        total_bytes=len(data),
        chunk_bytes=CHUNK,
        chunk_hashes=hashes,
        tensors=tensors,
        created_at=time.time() if created_at is None else created_at,
    )


def test_manifest_round_trip_and_chunk_checks() -> None:
    key = Ed25519PrivateKey.generate()
    data = bytes(range(256)) * 50  # 12800 bytes: 3 full chunks and a short one
    manifest = _manifest(key, data)
    parsed = parse_manifest(
        manifest.raw,
        expected_content_id=manifest.content_id,
        run_id="run",
        version=3,
        authorized_publishers={peer_id_from_private_key(key)},
    )
    assert parsed.num_chunks == 4 and parsed.chunk_size(3) == 12800 - 3 * CHUNK
    assert parsed.tensors == (TensorInfo("w", "F32", (2, 3), 100, 124),)
    parsed.check_chunk(3, data[3 * CHUNK :])
    with pytest.raises(InvalidMessage, match="does not match"):
        parsed.check_chunk(0, b"\x00" * CHUNK)
    with pytest.raises(InvalidMessage, match="bytes"):
        parsed.check_chunk(0, data[: CHUNK - 1])


def test_forged_manifests_are_refused() -> None:
    key, intruder = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    authorized = {peer_id_from_private_key(key)}
    manifest = _manifest(key, b"x" * 10000)

    with pytest.raises(UnauthorizedPublisher):
        parse_manifest(_manifest(intruder, b"x" * 10000).raw, authorized_publishers=authorized)

    signed = bpb.SignedManifest.FromString(manifest.raw)
    body = bpb.ManifestBody.FromString(signed.body)
    body.chunk_hashes = b"\x00" * len(body.chunk_hashes)  # tampered body, old signature
    tampered = bpb.SignedManifest(
        body=body.SerializeToString(), signature=signed.signature
    ).SerializeToString()
    with pytest.raises(InvalidMessage, match="signature"):
        parse_manifest(tampered, authorized_publishers=authorized)

    with pytest.raises(InvalidMessage, match="other content"):
        parse_manifest(manifest.raw, expected_content_id=b"\x01" * 32, authorized_publishers=authorized)
    with pytest.raises(InvalidMessage, match="run"):
        parse_manifest(manifest.raw, run_id="other", authorized_publishers=authorized)
    with pytest.raises(InvalidMessage, match="version"):
        parse_manifest(manifest.raw, version=4, authorized_publishers=authorized)
    with pytest.raises(InvalidMessage):
        parse_manifest(b"\xff" * 100)

    # a validly signed manifest whose hash list does not fit its declared size
    body = bpb.ManifestBody.FromString(signed.body)
    body.total_bytes = 10 * 1024 * 1024
    raw = body.SerializeToString()
    inconsistent = bpb.SignedManifest(
        body=raw, signature=key.sign(MANIFEST_CONTEXT + raw)
    ).SerializeToString()
    with pytest.raises(InvalidMessage, match="hashes"):
        parse_manifest(inconsistent, authorized_publishers=authorized)


def test_two_publishers_of_the_same_state_publish_the_same_content_id() -> None:
    alice, bob = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    data = bytes(range(256)) * 50
    by_alice = _manifest(alice, data, created_at=1000.0)
    by_bob = _manifest(bob, data, created_at=2000.0)
    assert by_alice.raw != by_bob.raw and by_alice.publisher != by_bob.publisher
    assert by_alice.content_id == by_bob.content_id
    assert by_alice.pointer().content_id == by_bob.pointer().content_id
    assert by_alice.content_id == content_id_of(
        run_id="run",
        version=3,
        total_bytes=len(data),
        chunk_bytes=CHUNK,
        chunk_hashes=by_alice.chunk_hashes,
        tensors=by_alice.tensors,
    )

    # bob's manifest answers alice's pointer for a fetcher that trusts both of them ...
    both = {by_alice.publisher, by_bob.publisher}
    parsed = parse_manifest(by_bob.raw, expected_content_id=by_alice.content_id, authorized_publishers=both)
    assert parsed.publisher == by_bob.publisher
    # ... and is refused, as unauthorised rather than bad, by one that trusts alice only
    with pytest.raises(UnauthorizedPublisher):
        parse_manifest(
            by_bob.raw, expected_content_id=by_alice.content_id, authorized_publishers={by_alice.publisher}
        )

    # anything that defines the bytes changes the content id
    changed = [
        _manifest(alice, data, run_id="other"),
        _manifest(alice, data, version=4),
        _manifest(alice, data[:-1] + b"\x00"),
        _manifest(alice, data + b"\x00"),
        _manifest(alice, data, tensors=(TensorInfo("w", "F16", (2, 3), 100, 124),)),
        _manifest(alice, data, tensors=(TensorInfo("w", "F32", (3, 2), 100, 124),)),
        _manifest(alice, data, tensors=(TensorInfo("v", "F32", (2, 3), 100, 124),)),
        _manifest(alice, data, tensors=()),
    ]
    ids = {m.content_id for m in changed}
    assert len(ids) == len(changed) and by_alice.content_id not in ids
    with pytest.raises(InvalidMessage, match="other content"):
        parse_manifest(changed[1].raw, expected_content_id=by_alice.content_id, authorized_publishers=both)


def _record(
    key: Ed25519PrivateKey, dht_key: str, domain: str, payload: bytes, signer_subkey: str
) -> DHTRecord:
    expires = time.time() + 60
    value = seal(
        key, domain=domain, run_id="run", payload=payload, expires_at=expires, seq=1, dht_key=dht_key
    )
    return DHTRecord(
        key=DHTID.generate(source=dht_key).to_bytes(),
        subkey=MSGPackSerializer.dumps(signer_subkey),
        value=MSGPackSerializer.dumps(value),
        expiration_time=expires,
    )


def test_dht_validator_accepts_own_pointer_and_refuses_a_pointer_for_another_publisher() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    me = peer_id_from_private_key(key)
    pointer = _manifest(key, b"y" * 9000).pointer()
    assert WeightsPointer.from_payload(pointer.to_payload()) == pointer
    dht_key = weights_pointer_key("run")
    subkey = signed_subkey(PeerID(me).to_base58())
    validator = SignedRecordValidator()
    assert validator.validate(_record(key, dht_key, WEIGHTS_POINTER_DOMAIN, pointer.to_payload(), subkey))
    foreign = _manifest(other, b"y" * 9000).pointer()
    assert not validator.validate(_record(key, dht_key, WEIGHTS_POINTER_DOMAIN, foreign.to_payload(), subkey))

    holders_key = weights_holders_key("run", 3)
    announcement = HolderAnnouncement("run", 3, pointer.content_id, 1, pointer.num_chunks)
    assert validator.validate(
        _record(key, holders_key, WEIGHTS_HOLDER_DOMAIN, announcement.to_payload(), subkey)
    )
    liar = HolderAnnouncement("run", 3, pointer.content_id, 9, 3)
    assert not validator.validate(_record(key, holders_key, WEIGHTS_HOLDER_DOMAIN, liar.to_payload(), subkey))


def test_pointer_with_impossible_manifest_size_is_refused() -> None:
    pointer = _manifest(Ed25519PrivateKey.generate(), b"z" * 9000).pointer()
    message = bpb.WeightsPointer.FromString(pointer.to_payload())
    message.manifest_bytes = 1 << 40
    with pytest.raises(InvalidMessage, match="manifest size"):
        WeightsPointer.from_payload(message.SerializeToString())


def test_bitmap_parsing_is_strict() -> None:
    assert parse_bitmap(b"\xff\x03", 10) == bytearray(b"\xff\x03")
    with pytest.raises(InvalidMessage, match="past the last"):
        parse_bitmap(b"\xff\x07", 10)
    with pytest.raises(InvalidMessage):
        parse_bitmap(b"\xff", 10)
