"""Fuzzing the pure parsers of network bytes in `protocol/`: every input either parses or raises
the module's documented error (InvalidMessage / InvalidProofError), within the 1 s deadline, and
inputs over the size cap are refused before they are decoded.

Each property runs twice (see tests.helpers.fuzzing): a fast variant in the default suite and a
`slow` one with thousands of derandomized cases.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer
from hypothesis import strategies as st

from protocol import broadcast_pb2 as bpb
from protocol import hivenet_pb2 as pb
from protocol import record_validator
from protocol.address_attestation import MAX_ATTESTATION_BYTES, open_attestation, seal_attestation
from protocol.averaging_round import ROUND_DECLARATION_TTL_S
from protocol.chunk_bitmap import parse_bitmap
from protocol.dht_keys import node_records_key, signed_subkey
from protocol.envelope import open_envelope, peek_domain, seal
from protocol.errors import InvalidMessage, InvalidProofError
from protocol.limits import (
    MAX_CLOCK_SKEW_S,
    MAX_ENVELOPE_BYTES,
    MAX_MANIFEST_BYTES,
)
from protocol.manifest import (
    HolderAnnouncement,
    TensorInfo,
    WeightsPointer,
    build_manifest,
    parse_manifest,
)
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator
from protocol.toploc import build_proofs, verify_proofs
from protocol.untrusted import capped_bytes, parse_untrusted
from tests.helpers.fuzzing import EDGE_FLOATS, arbitrary_or_mutated, fuzz_variants

RUN = "fuzz-run"
KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"fuzz signer").digest())
KEY_ID = peer_id_from_private_key(KEY)
NOW = 1_800_000_000.0
SUBJECT_ID = peer_id_from_private_key(
    Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"fuzz node").digest())
)

ATTESTATION = seal_attestation(
    KEY,
    subject=SUBJECT_ID,
    addresses=["/ip4/203.0.113.7/tcp/31337", "/ip6/2001:db8::1/tcp/1"],
    issued_at=NOW - 10,
)

NODE_RECORD = NodeRecord(
    peer_id=KEY_ID,
    roles=(Role.TRAINER, Role.SEED),
    public_name="fuzz node",
    run_id=RUN,
    software_version="0.1.0",
    protocol_version=1,
    capabilities=Capabilities(cpu_count=4, memory_bytes=1 << 32, accelerator="none"),
    addresses=("/ip4/203.0.113.7/tcp/31337", "/ip6/2001:db8::1/tcp/1"),
    started_at=NOW - 100,
    instance_id=b"\x01" * 16,
    attestations=(ATTESTATION,),
).to_payload()

ENVELOPE = seal(
    KEY,
    domain=NODE_RECORD_DOMAIN,
    run_id=RUN,
    dht_key=node_records_key(RUN),
    expires_at=NOW + 60,
    seq=7,
    payload=NODE_RECORD,
)

_FILE = bytes(range(256)) * 40  # 10240 bytes: three 4 KiB chunks, the last one partial
MANIFEST = build_manifest(
    KEY,
    run_id=RUN,
    version=3,
    total_bytes=len(_FILE),
    chunk_bytes=4096,
    chunk_hashes=b"".join(hashlib.sha256(_FILE[i : i + 4096]).digest() for i in range(0, len(_FILE), 4096)),
    tensors=[TensorInfo("w", "F32", (2560,), 0, len(_FILE))],
    created_at=NOW,
)
POINTER = MANIFEST.pointer().to_payload()
HOLDER = HolderAnnouncement(
    run_id=RUN,
    version=3,
    content_id=MANIFEST.content_id,
    chunks_held=2,
    num_chunks=3,
    addresses=("/ip4/203.0.113.7/tcp/31337",),
    attestations=(ATTESTATION,),
).to_payload()


# --- envelopes ---------------------------------------------------------------------------------


def _envelope_property(data: bytes) -> None:
    with contextlib.suppress(InvalidMessage):
        peek_domain(data)
    try:
        opened = open_envelope(data, domain=NODE_RECORD_DOMAIN, max_ttl_s=300, now=NOW)
    except InvalidMessage:
        return
    assert opened.signer == KEY_ID  # only the one signer in play can have produced a valid one


test_envelope_fast, test_envelope_slow = fuzz_variants(
    _envelope_property, arbitrary_or_mutated(ENVELOPE, max_size=MAX_ENVELOPE_BYTES)
)


def _envelope_expiry_property(expires_at: float, max_ttl_s: float) -> None:
    data = seal(KEY, domain=NODE_RECORD_DOMAIN, run_id=RUN, payload=b"", expires_at=expires_at, seq=1)
    try:
        open_envelope(data, domain=NODE_RECORD_DOMAIN, max_ttl_s=max_ttl_s, now=NOW)
    except InvalidMessage:
        return
    # a signer chooses its own expiry, but an accepted one always lies within the allowed window
    assert NOW - MAX_CLOCK_SKEW_S <= expires_at <= NOW + max_ttl_s + MAX_CLOCK_SKEW_S


test_envelope_expiry_fast, test_envelope_expiry_slow = fuzz_variants(
    _envelope_expiry_property,
    st.one_of(EDGE_FLOATS, st.floats(), st.floats(NOW - 100, NOW + 1000)),
    st.sampled_from([60.0, 300.0, 3600.0]),
)


def test_envelope_seed_is_valid() -> None:
    assert open_envelope(ENVELOPE, domain=NODE_RECORD_DOMAIN, now=NOW).payload == NODE_RECORD


def test_oversized_envelope_is_refused_before_decoding() -> None:
    # a well-formed envelope padded past the cap with a valid unknown field: only the size is wrong
    padded = ENVELOPE + b"\x7a" + b"\xff\x3f" + b"\x00" * 0x1FFF  # field 15, length-delimited, 8191 bytes
    assert len(padded) > MAX_ENVELOPE_BYTES
    for parse in (peek_domain, lambda d: open_envelope(d, domain=NODE_RECORD_DOMAIN, now=NOW)):
        with pytest.raises(InvalidMessage, match="exceeds"):
            parse(padded)


@pytest.mark.parametrize("data", [None, "text", bytearray(ENVELOPE), memoryview(ENVELOPE), 3])
def test_envelope_refuses_non_bytes(data: object) -> None:
    with pytest.raises(InvalidMessage, match="must be bytes"):
        peek_domain(data)


# --- node records ------------------------------------------------------------------------------


def _node_record_property(data: bytes) -> None:
    try:
        record = NodeRecord.from_payload(data)
    except InvalidMessage:
        return
    assert NodeRecord.from_payload(record.to_payload()) == record


test_node_record_fast, test_node_record_slow = fuzz_variants(
    _node_record_property, arbitrary_or_mutated(NODE_RECORD)
)


# --- address attestations ----------------------------------------------------------------------


def _attestation_property(data: bytes) -> None:
    try:
        opened = open_attestation(data, now=NOW)
    except InvalidMessage:
        return
    # the one signer in play signed exactly these: no mutation of the bytes changes what it attests
    assert (opened.signer, opened.subject) == (KEY_ID, SUBJECT_ID)
    assert opened.addresses == ("/ip4/203.0.113.7/tcp/31337", "/ip6/2001:db8::1/tcp/1")


test_attestation_fast, test_attestation_slow = fuzz_variants(
    _attestation_property, arbitrary_or_mutated(ATTESTATION, max_size=MAX_ATTESTATION_BYTES + 64)
)


def test_attestation_seed_is_valid() -> None:
    assert open_attestation(ATTESTATION, subject=SUBJECT_ID, signers={KEY_ID}, now=NOW).issued_at == NOW - 10


# --- manifests, pointers, holder announcements, bitmaps -----------------------------------------


def _manifest_property(data: bytes) -> None:
    try:
        manifest = parse_manifest(data, authorized_publishers={KEY_ID})
    except InvalidMessage:
        return
    assert manifest.publisher == KEY_ID and manifest.raw == data


test_manifest_fast, test_manifest_slow = fuzz_variants(_manifest_property, arbitrary_or_mutated(MANIFEST.raw))


def test_oversized_manifest_is_refused_before_hashing_or_decoding() -> None:
    with pytest.raises(InvalidMessage, match="exceeds"):
        parse_manifest(MANIFEST.raw + bytes(MAX_MANIFEST_BYTES), expected_content_id=MANIFEST.content_id)


def _pointer_property(data: bytes) -> None:
    try:
        pointer = WeightsPointer.from_payload(data)
    except InvalidMessage:
        return
    assert len(pointer.content_id) == 32 and pointer.num_chunks > 0


test_pointer_fast, test_pointer_slow = fuzz_variants(_pointer_property, arbitrary_or_mutated(POINTER))


def _holder_property(data: bytes) -> None:
    try:
        holder = HolderAnnouncement.from_payload(data)
    except InvalidMessage:
        return
    assert holder.chunks_held <= holder.num_chunks


test_holder_fast, test_holder_slow = fuzz_variants(_holder_property, arbitrary_or_mutated(HOLDER))


def _bitmap_property(data: bytes, num_chunks: int) -> None:
    try:
        bitmap = parse_bitmap(data, num_chunks)
    except InvalidMessage:
        return
    assert len(bitmap) * 8 - num_chunks < 8


test_bitmap_fast, test_bitmap_slow = fuzz_variants(
    _bitmap_property, st.binary(max_size=64), st.integers(0, 600)
)


# --- the generic untrusted protobuf parse -------------------------------------------------------

_MESSAGE_TYPES = [
    pb.SignedEnvelope,
    pb.EnvelopeBody,
    pb.NodeRecord,
    pb.DialBackRequest,
    pb.DialBackResponse,
    pb.AddressAttestation,
    bpb.SignedManifest,
    bpb.ManifestBody,
    bpb.WeightsPointer,
    bpb.HolderAnnouncement,
    bpb.ChunkRequest,
    bpb.HaveUpdate,
]


def _untrusted_property(data: bytes, message_type: type) -> None:
    try:
        message: object = parse_untrusted(message_type, data, "fuzz")
    except InvalidMessage:
        return
    assert isinstance(message, message_type)


test_untrusted_fast, test_untrusted_slow = fuzz_variants(
    _untrusted_property,
    st.one_of(st.binary(max_size=1024), arbitrary_or_mutated(MANIFEST.raw), arbitrary_or_mutated(ENVELOPE)),
    st.sampled_from(_MESSAGE_TYPES),
)


def _capped_bytes_property(data: object, limit: int) -> None:
    try:
        result = capped_bytes(data, limit, "fuzz")
    except InvalidMessage:
        assert not isinstance(data, bytes) or len(data) > limit
        return
    assert result is data and len(result) <= limit


test_capped_bytes_fast, test_capped_bytes_slow = fuzz_variants(
    _capped_bytes_property,
    st.one_of(st.binary(max_size=64), st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers())),
    st.integers(0, 64),
)


# --- the DHT record validator -------------------------------------------------------------------

_VALID_KEY = DHTID.generate(source=node_records_key(RUN)).to_bytes()
_VALID_SUBKEY = MSGPackSerializer.dumps(signed_subkey(PeerID(KEY_ID).to_base58()))
_LIVE_EXPIRY = NOW + 250  # within the node-record TTL cap (300 s) of the frozen clock below
_LIVE_ENVELOPE = seal(
    KEY,
    domain=NODE_RECORD_DOMAIN,
    run_id=RUN,
    dht_key=node_records_key(RUN),
    expires_at=_LIVE_EXPIRY,
    seq=1,
    payload=NODE_RECORD,
)
_VALID_VALUE = MSGPackSerializer.dumps(_LIVE_ENVELOPE)


def _validate_at_now(record: DHTRecord) -> bool:
    """The validator's verdict with its clock frozen at NOW, so valid seeds stay valid however long a run takes."""
    with mock.patch.object(record_validator, "time", SimpleNamespace(time=lambda: NOW)):
        return SignedRecordValidator().validate(record)


_LONGEST_TTL_S = max(rule.max_ttl_s for rule in record_validator.DOMAIN_RULES.values())


def _validator_property(key: bytes, subkey: bytes, value: bytes, expiration: float) -> None:
    record = DHTRecord(key=key, subkey=subkey, value=value, expiration_time=expiration)
    if _validate_at_now(record):
        # an accepted record must expire, and within the longest TTL any record may have
        assert record.expiration_time <= NOW + _LONGEST_TTL_S + MAX_CLOCK_SKEW_S


test_record_validator_fast, test_record_validator_slow = fuzz_variants(
    _validator_property,
    st.one_of(st.just(_VALID_KEY), st.binary(max_size=40)),
    st.one_of(st.just(_VALID_SUBKEY), arbitrary_or_mutated(_VALID_SUBKEY, max_size=80)),
    st.one_of(st.just(_VALID_VALUE), arbitrary_or_mutated(_VALID_VALUE, max_size=MAX_ENVELOPE_BYTES + 64)),
    st.one_of(EDGE_FLOATS, st.floats(), st.just(_LIVE_EXPIRY)),
)


_UNSIGNED_SUBKEYS = st.binary(min_size=32, max_size=32).map(
    lambda h: MSGPackSerializer.dumps(b"\x12\x20" + h)
)
_UNSIGNED_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), 1 << 63), st.floats()).map(
    MSGPackSerializer.dumps
)

# unsigned values in every shape hivemind writes (plain values, raw PeerID subkeys): never accepted
test_record_validator_unsigned_fast, test_record_validator_unsigned_slow = fuzz_variants(
    _validator_property,
    st.binary(min_size=20, max_size=20),
    st.one_of(_UNSIGNED_SUBKEYS, arbitrary_or_mutated(MSGPackSerializer.dumps(b"\x12\x20" + bytes(32)))),
    st.one_of(_UNSIGNED_VALUES, st.binary(max_size=20)),
    st.one_of(EDGE_FLOATS, st.floats(), st.floats(NOW - 100, NOW + 2 * ROUND_DECLARATION_TTL_S)),
)


def test_record_validator_seed_is_valid_and_oversized_value_is_refused() -> None:
    assert _validate_at_now(DHTRecord(_VALID_KEY, _VALID_SUBKEY, _VALID_VALUE, _LIVE_EXPIRY))
    oversized = DHTRecord(_VALID_KEY, _VALID_SUBKEY, _VALID_VALUE + bytes(MAX_ENVELOPE_BYTES), NOW)
    assert not _validate_at_now(oversized)


# --- TOPLOC proofs ------------------------------------------------------------------------------

_HIDDEN = torch.arange(40 * 8, dtype=torch.float32).reshape(40, 8).sin().to(torch.bfloat16)
_PROOFS = build_proofs(_HIDDEN, chunk_tokens=32, topk=8)


@st.composite
def _proof_lists(draw: st.DrawFn) -> list[bytes]:
    proofs = list(_PROOFS)
    if draw(st.booleans()):
        index = draw(st.integers(0, len(proofs) - 1))
        proofs[index] = draw(arbitrary_or_mutated(proofs[index], max_size=64))
    if draw(st.booleans()):
        proofs = draw(st.lists(st.binary(max_size=40), max_size=4))
    return proofs


def _toploc_property(proofs: list[bytes]) -> None:
    try:
        checks = verify_proofs(_HIDDEN, proofs, chunk_tokens=32, topk=8)
    except InvalidProofError:
        return
    assert len(checks) == len(_PROOFS)


test_toploc_fast, test_toploc_slow = fuzz_variants(_toploc_property, _proof_lists())


def test_toploc_seed_proofs_verify_exactly() -> None:
    assert all(c.value_mismatches == 0 for c in verify_proofs(_HIDDEN, _PROOFS, chunk_tokens=32, topk=8))


def test_toploc_oversized_proof_is_refused_before_evaluating() -> None:
    with pytest.raises(InvalidProofError, match="bytes, expected"):
        verify_proofs(_HIDDEN, [_PROOFS[0] + bytes(1 << 20), _PROOFS[1]], chunk_tokens=32, topk=8)


# --- regressions: the failing examples fuzzing found, kept as explicit tests ----------------------


def test_envelope_with_nan_expiry_is_refused() -> None:
    # a NaN expiry passed both range checks (every comparison with NaN is False): never expired
    data = seal(KEY, domain=NODE_RECORD_DOMAIN, run_id=RUN, payload=b"", expires_at=math.nan, seq=1)
    with pytest.raises(InvalidMessage, match="expired"):
        open_envelope(data, domain=NODE_RECORD_DOMAIN, now=NOW)
    with pytest.raises(InvalidMessage):
        open_envelope(data, domain=NODE_RECORD_DOMAIN, max_ttl_s=60.0, now=NOW)


def test_replayed_signed_record_with_nan_expiration_is_refused() -> None:
    # anyone could re-store a peer's valid signed record with a NaN DHT expiration: hivemind's storage
    # never expires it and never replaces it (`old < new` is False), hiding the peer's later updates
    replay = DHTRecord(_VALID_KEY, _VALID_SUBKEY, _VALID_VALUE, math.nan)
    assert not _validate_at_now(replay)
    with pytest.raises(InvalidMessage, match="ahead"):
        record_validator.check_signed_record(replay, now=NOW)


def test_unsigned_records_are_refused_whatever_their_shape() -> None:
    # what hivemind's averagers stored (a PeerID subkey, a scalar value) is refused now: they sign
    for value in (b"\xc0", b"\xc3", MSGPackSerializer.dumps(7.0)):
        for expiration in (NOW + 10, math.nan):
            record = DHTRecord(bytes(20), MSGPackSerializer.dumps(b"\x12\x20" + bytes(32)), value, expiration)
            assert not _validate_at_now(record)


def test_node_record_with_infinite_start_time_is_refused() -> None:
    """Found by fuzzing: started_at=inf was accepted and shown as an age of -inf."""
    import math

    from protocol.node_record import Capabilities, NodeRecord, Role

    fields: dict = dict(
        peer_id=b"\x00\x24" + b"\x01" * 36,
        roles=(Role.VALIDATOR,),
        public_name="n",
        run_id="r",
        software_version="0.1.0",
        protocol_version=1,
        capabilities=Capabilities(cpu_count=1, memory_bytes=1 << 30),
        addresses=("/ip4/127.0.0.1/tcp/1",),
        instance_id=b"\x00" * 16,
    )
    NodeRecord(**fields, started_at=5.0)  # the same record with a finite start time is valid
    with pytest.raises(ValueError, match="started_at"):
        NodeRecord(**fields, started_at=math.inf)
