"""The averaging service's messages (`protocol.averaging_round`): the builders round-trip through the
parsers, the parsers turn every malformed or out-of-range message into InvalidMessage (and nothing
else), and the DHT record validator takes signed round declarations only with a valid payload.
"""

from __future__ import annotations

import hashlib
import math
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer
from hypothesis import given
from hypothesis import strategies as st

from protocol import collective_pb2 as pb
from protocol.averaging_round import (
    MAX_COMMIT_HELD,
    MAX_ROUND_STEP,
    ROUND_DECLARATION_DOMAIN,
    ROUND_DECLARATION_TTL_S,
    ContributionHeader,
    RoundDeclaration,
    commit_payload,
    parse_commit,
    parse_contribution_header,
    parse_round_declaration,
)
from protocol.dht_keys import averaging_prefix, averaging_round_key, signed_subkey
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator, check_signed_record
from tests.helpers.fuzzing import EDGE_FLOATS, FAST, arbitrary_or_mutated, fuzz_variants

HASH = "0123456789abcdef"
SHA = hashlib.sha256(b"payload").digest()

STEPS = st.integers(0, MAX_ROUND_STEP)
HASHES = st.from_regex(r"[0-9a-f]{16}", fullmatch=True)
CODECS = st.from_regex(r"[a-z0-9_]{1,16}", fullmatch=True)
PEERS = st.binary(min_size=1, max_size=64)
SHAS = st.binary(min_size=32, max_size=32)

DECLARATION = RoundDeclaration(12, HASH, "int8", 1_800_000_000.5, True)
HEADER = ContributionHeader(12, HASH, "sparseloco", SHA, 4096)
HELD = {bytes([i]) * 38: hashlib.sha256(bytes([i])).digest() for i in range(1, 4)}
COMMIT = commit_payload(12, HELD)


# --- builders and parsers round-trip -----------------------------------------------------------


@FAST
@given(STEPS, HASHES, CODECS, st.floats(min_value=0.0, allow_nan=False, allow_infinity=False), st.booleans())
def test_round_declarations_round_trip(
    step: int, outer_hash: str, codec: str, gather_at: float, serves_state: bool
) -> None:
    declaration = RoundDeclaration(step, outer_hash, codec, gather_at, serves_state)
    assert parse_round_declaration(declaration.payload()) == declaration


@FAST
@given(STEPS, HASHES, CODECS, SHAS, st.integers(0, 2**64 - 1))
def test_contribution_headers_round_trip(
    step: int, outer_hash: str, codec: str, sha: bytes, size: int
) -> None:
    header = ContributionHeader(step, outer_hash, codec, sha, size)
    assert parse_contribution_header(header.payload()) == header


@FAST
@given(STEPS, st.dictionaries(PEERS, SHAS, max_size=MAX_COMMIT_HELD))
def test_commits_round_trip(step: int, held: dict[bytes, bytes]) -> None:
    data = commit_payload(step, held)
    assert parse_commit(data) == (step, held)
    # peers go in byte order: the same commit is the same bytes, whatever the dict's order
    assert commit_payload(step, dict(reversed(list(held.items())))) == data


def test_the_largest_step_and_a_full_commit_are_accepted() -> None:
    full = {i.to_bytes(2, "big"): SHA for i in range(MAX_COMMIT_HELD)}
    assert parse_commit(commit_payload(MAX_ROUND_STEP, full)) == (MAX_ROUND_STEP, full)
    top = RoundDeclaration(MAX_ROUND_STEP, HASH, "int8", 0.0, False)
    assert parse_round_declaration(top.payload()) == top


def test_builders_refuse_what_the_parsers_refuse() -> None:
    with pytest.raises(InvalidMessage):
        RoundDeclaration(1, "not a hash", "int8", 1.0, True).payload()
    with pytest.raises(InvalidMessage):
        ContributionHeader(1, HASH, "int8", b"short", 5).payload()
    with pytest.raises(InvalidMessage):
        commit_payload(MAX_ROUND_STEP + 1, {})


# --- malformed messages ------------------------------------------------------------------------


def _declaration(**fields: object) -> bytes:
    values: dict[str, object] = dict(step=3, outer_hash=HASH, codec="int8", gather_at=10.0, serves_state=True)
    values.update(fields)
    return pb.RoundDeclaration(**values).SerializeToString()  # type: ignore[arg-type]


def _header(**fields: object) -> bytes:
    values: dict[str, object] = dict(
        step=3, outer_hash=HASH, codec="int8", payload_sha256=SHA, payload_bytes=9
    )
    values.update(fields)
    return pb.ContributionHeader(**values).SerializeToString()  # type: ignore[arg-type]


def _commit(step: int, held: list[tuple[bytes, bytes]]) -> bytes:
    return pb.Commit(step=step, held=[pb.Held(peer=p, payload_sha256=h) for p, h in held]).SerializeToString()


def test_the_hand_built_messages_are_valid() -> None:
    parse_round_declaration(_declaration())
    parse_contribution_header(_header())
    parse_commit(_commit(3, [(b"a", SHA), (b"b", SHA)]))


@pytest.mark.parametrize("step", [MAX_ROUND_STEP + 1, 2**63, 2**64 - 1])
def test_out_of_range_steps_are_refused(step: int) -> None:
    with pytest.raises(InvalidMessage):
        parse_round_declaration(_declaration(step=step))
    with pytest.raises(InvalidMessage):
        parse_contribution_header(_header(step=step))
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(step, []))


BAD_HASHES = [
    "",
    HASH[:15],
    HASH + "0",
    HASH.upper(),
    "g" * 16,
    " " + HASH[1:],
    "\uff10" * 16,
    HASH[:8] + "-" * 8,
]


@pytest.mark.parametrize("outer_hash", BAD_HASHES)
def test_bad_outer_hashes_are_refused(outer_hash: str) -> None:
    with pytest.raises(InvalidMessage):
        parse_round_declaration(_declaration(outer_hash=outer_hash))
    with pytest.raises(InvalidMessage):
        parse_contribution_header(_header(outer_hash=outer_hash))


BAD_CODECS = ["", "Int8", "x" * 17, "int-8", "int 8", "é", "int8\x00"]


@pytest.mark.parametrize("codec", BAD_CODECS)
def test_bad_codec_names_are_refused(codec: str) -> None:
    with pytest.raises(InvalidMessage):
        parse_round_declaration(_declaration(codec=codec))
    with pytest.raises(InvalidMessage):
        parse_contribution_header(_header(codec=codec))


@pytest.mark.parametrize("field", ["outer_hash", "codec"])
def test_a_trailing_newline_is_refused(field: str) -> None:
    fields = {"outer_hash": HASH, "codec": "int8"}
    fields[field] += "\n"
    with pytest.raises(InvalidMessage):
        parse_round_declaration(_declaration(**fields))


@pytest.mark.parametrize("gather_at", [math.nan, math.inf, -math.inf, -1.0, -5e-324])
def test_non_finite_or_negative_gather_times_are_refused(gather_at: float) -> None:
    with pytest.raises(InvalidMessage):
        parse_round_declaration(_declaration(gather_at=gather_at))


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_payload_hashes_of_the_wrong_length_are_refused(size: int) -> None:
    with pytest.raises(InvalidMessage):
        parse_contribution_header(_header(payload_sha256=b"\x01" * size))
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(3, [(b"a", SHA), (b"b", b"\x01" * size)]))


@pytest.mark.parametrize("peer", [b"", b"p" * 65])
def test_commits_naming_a_malformed_peer_are_refused(peer: bytes) -> None:
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(3, [(b"a", SHA), (peer, SHA)]))


def test_commits_naming_a_peer_twice_are_refused() -> None:
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(3, [(b"a", SHA), (b"b", SHA), (b"a", SHA)]))
    other = hashlib.sha256(b"other").digest()  # even with two different hashes
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(3, [(b"a", SHA), (b"a", other)]))


def test_commits_naming_too_many_peers_are_refused() -> None:
    held = [(i.to_bytes(2, "big"), SHA) for i in range(MAX_COMMIT_HELD + 1)]
    with pytest.raises(InvalidMessage):
        parse_commit(_commit(3, held))
    assert len(parse_commit(_commit(3, held[:-1]))[1]) == MAX_COMMIT_HELD


@pytest.mark.parametrize("data", [b"\xff", b"\x0a\x05ab", b"\x12\x02\xc3\x28", b"\x08" + b"\xff" * 11])
def test_undecodable_bytes_are_refused(data: bytes) -> None:
    for parse in (parse_round_declaration, parse_contribution_header, parse_commit):
        with pytest.raises(InvalidMessage):
            parse(data)


# --- fuzz --------------------------------------------------------------------------------------


def _declaration_property(data: bytes) -> None:
    try:
        declaration = parse_round_declaration(data)
    except InvalidMessage:
        return
    assert 0 <= declaration.step <= MAX_ROUND_STEP
    assert math.isfinite(declaration.gather_at) and declaration.gather_at >= 0
    assert parse_round_declaration(declaration.payload()) == declaration


def _header_property(data: bytes) -> None:
    try:
        header = parse_contribution_header(data)
    except InvalidMessage:
        return
    assert 0 <= header.step <= MAX_ROUND_STEP and len(header.payload_sha256) == 32
    assert parse_contribution_header(header.payload()) == header


def _commit_property(data: bytes) -> None:
    try:
        step, held = parse_commit(data)
    except InvalidMessage:
        return
    assert 0 <= step <= MAX_ROUND_STEP and len(held) <= MAX_COMMIT_HELD
    assert all(0 < len(p) <= 64 and len(h) == 32 for p, h in held.items())
    assert parse_commit(commit_payload(step, held)) == (step, held)


def _gather_time_property(gather_at: float) -> None:
    try:
        declaration = parse_round_declaration(_declaration(gather_at=gather_at))
    except InvalidMessage:
        assert not (math.isfinite(gather_at) and gather_at >= 0)
        return
    assert declaration.gather_at == gather_at


test_declaration_fuzz_fast, test_declaration_fuzz_slow = fuzz_variants(
    _declaration_property, arbitrary_or_mutated(DECLARATION.payload())
)
test_header_fuzz_fast, test_header_fuzz_slow = fuzz_variants(
    _header_property, arbitrary_or_mutated(HEADER.payload())
)
test_commit_fuzz_fast, test_commit_fuzz_slow = fuzz_variants(_commit_property, arbitrary_or_mutated(COMMIT))
test_gather_time_fuzz_fast, test_gather_time_fuzz_slow = fuzz_variants(
    _gather_time_property, st.one_of(EDGE_FLOATS, st.floats())
)


# --- the DHT record validator ------------------------------------------------------------------

PREFIX = averaging_prefix("round-test")
KEY = averaging_round_key(PREFIX)
TRAINER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"round trainer").digest())


def _record(payload: bytes, *, ttl_s: float = 30.0, key: str = KEY) -> DHTRecord:
    expires = time.time() + ttl_s
    envelope = seal(
        TRAINER,
        domain=ROUND_DECLARATION_DOMAIN,
        run_id="",
        dht_key=key,
        expires_at=expires,
        seq=1,
        payload=payload,
    )
    return DHTRecord(
        DHTID.generate(source=KEY).to_bytes(),
        MSGPackSerializer.dumps(signed_subkey(PeerID(peer_id_from_private_key(TRAINER)).to_base58())),
        MSGPackSerializer.dumps(envelope),
        expires,
    )


def test_the_validator_accepts_a_signed_round_declaration() -> None:
    record = _record(DECLARATION.payload())
    check_signed_record(record)
    assert SignedRecordValidator().validate(record)


BAD_PAYLOADS = {
    "undecodable": b"\xff\xff",
    "step out of range": _declaration(step=MAX_ROUND_STEP + 1),
    "bad hash": _declaration(outer_hash="XYZ"),
    "bad codec": _declaration(codec="Int-8"),
    "gather time NaN": _declaration(gather_at=math.nan),
    "negative gather time": _declaration(gather_at=-1.0),
}


@pytest.mark.parametrize("kind", list(BAD_PAYLOADS))
def test_the_validator_refuses_a_round_declaration_with_a_bad_payload(kind: str) -> None:
    record = _record(BAD_PAYLOADS[kind])
    with pytest.raises(InvalidMessage):
        check_signed_record(record)
    assert not SignedRecordValidator().validate(record)


def test_the_validator_refuses_a_round_declaration_for_another_key_or_too_long() -> None:
    assert not SignedRecordValidator().validate(_record(DECLARATION.payload(), key=KEY + "x"))
    assert not SignedRecordValidator().validate(
        _record(DECLARATION.payload(), ttl_s=2 * ROUND_DECLARATION_TTL_S)
    )
