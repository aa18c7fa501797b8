"""The DHT record validator: valid node records pass, every kind of forgery is refused (on real
DHT nodes: tests/integration/node/test_record_validator_dht.py)."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from protocol import collective_pb2 as pb_round
from protocol.averaging_round import ROUND_DECLARATION_DOMAIN, RoundDeclaration
from protocol.dht_keys import signed_subkey
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator, check_signed_record
from tests.helpers.forged_records import (
    A_ID,
    ALICE,
    FORGERIES,
    KEY,
    dht_record,
    forgery,
    node_record,
    sealed_value,
    valid_record,
)


def test_valid_record_passes() -> None:
    check_signed_record(valid_record())
    assert SignedRecordValidator().validate(valid_record())


@pytest.mark.parametrize("kind", FORGERIES)
def test_forgery_is_rejected(kind: str) -> None:
    record = forgery(kind)
    with pytest.raises(InvalidMessage):
        check_signed_record(record)
    assert not SignedRecordValidator().validate(record)


def _unsigned(subkey: object, value: object, ttl_s: float = 5.0) -> DHTRecord:
    return DHTRecord(
        DHTID.generate(source=KEY).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(value),
        time.time() + ttl_s,
    )


@pytest.mark.parametrize("value", [True, False, 12.5, 7, None])
def test_unsigned_declarations_are_refused(value: object) -> None:
    # anyone could write them under anyone's PeerID: hivenet's trainers sign theirs
    assert not SignedRecordValidator().validate(_unsigned(A_ID, value))


GROUP_KEY = "hivenet_diloco_validator-test.rounds"


def _round(step: int = 3, serves_state: bool = True) -> bytes:
    return RoundDeclaration(step, "0123456789abcdef", "int8", time.time() + 5, serves_state).payload()


def _declaration(
    signer: Ed25519PrivateKey, payload: bytes, *, key: str = GROUP_KEY, subkey_of: bytes | None = None
) -> DHTRecord:
    expires = time.time() + 30
    envelope = seal(
        signer,
        domain=ROUND_DECLARATION_DOMAIN,
        run_id="",
        dht_key=key,
        expires_at=expires,
        seq=1,
        payload=payload,
    )
    subkey = signed_subkey(PeerID(subkey_of or peer_id_from_private_key(signer)).to_base58())
    return DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(envelope),
        expires,
    )


def test_signed_round_declarations_pass_and_forged_ones_are_refused() -> None:
    assert SignedRecordValidator().validate(_declaration(ALICE, _round()))
    assert SignedRecordValidator().validate(_declaration(ALICE, _round(step=7, serves_state=False)))
    mallory = Ed25519PrivateKey.generate()
    # Mallory declares a step for Alice: signed by Mallory under Alice's subkey
    assert not SignedRecordValidator().validate(_declaration(mallory, _round(step=10**6), subkey_of=A_ID))
    # a declaration signed for another key, replayed under this one
    replayed = _declaration(ALICE, _round(), key="hivenet_diloco_other.rounds")
    moved = DHTRecord(
        DHTID.generate(source=GROUP_KEY).to_bytes(), replayed.subkey, replayed.value, replayed.expiration_time
    )
    assert not SignedRecordValidator().validate(moved)
    # a gather time that is not a finite time
    bad = pb_round.RoundDeclaration(
        step=1, outer_hash="0123456789abcdef", codec="int8", gather_at=float("inf")
    ).SerializeToString()
    assert not SignedRecordValidator().validate(_declaration(ALICE, bad))


UNSIGNED_ABUSES = {
    "plain value without a subkey": (None, b"squatted", 5.0),
    "plain value, 31-year expiry": (None, b"squatted", 31 * 365 * 86400.0),
    "subkey is not a PeerID": (b"averager", 1.0, 5.0),
    "subkey is a string": ("anything", 1.0, 5.0),
    "value is bytes": (A_ID, b"x" * 12, 5.0),
    "value is a megabyte": (A_ID, b"x" * (1 << 20), 5.0),
    "value is a list": (A_ID, [1, 2, 3], 5.0),
    "expiry 31 years ahead": (A_ID, 1.0, 31 * 365 * 86400.0),
}


@pytest.mark.parametrize("kind", list(UNSIGNED_ABUSES))
def test_unsigned_records_of_any_shape_are_refused(kind: str) -> None:
    subkey, value, ttl_s = UNSIGNED_ABUSES[kind]
    assert not SignedRecordValidator().validate(_unsigned(subkey, value, ttl_s))


def test_dht_expiry_beyond_the_signed_expiry_is_refused_without_skew() -> None:
    expires = time.time() + 60
    record = dht_record(A_ID, sealed_value(ALICE, node_record(A_ID).to_payload(), expires), expires + 1.0)
    assert not SignedRecordValidator().validate(record)
