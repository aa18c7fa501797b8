"""The DHT record validator: valid node records pass, every kind of forgery is dropped,
both in unit form and on a real pair of DHT nodes (a forged record is never returned by get)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import hivemind
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from node.identity import create_identity
from node.swarm import wait_until
from protocol import hivenet_pb2 as pb
from protocol.averager_declaration import AVERAGER_DECLARATION_DOMAIN, declaration_payload
from protocol.dht_keys import node_records_key, signed_subkey
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.limits import MAX_ENVELOPE_BYTES, MAX_NODE_RECORD_TTL_S
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator, check_signed_record

RUN = "validator-test"
KEY = node_records_key(RUN)


def _record(peer_id: bytes, **overrides: object) -> NodeRecord:
    fields: dict = dict(
        peer_id=peer_id,
        roles=(Role.VALIDATOR,),
        public_name="alice",
        run_id=RUN,
        software_version="0.1.0",
        protocol_version=1,
        capabilities=Capabilities(cpu_count=2, memory_bytes=1 << 30),
        addresses=("/ip4/127.0.0.1/tcp/1",),
        started_at=time.time(),
        instance_id=secrets.token_bytes(16),
    )
    fields.update(overrides)
    return NodeRecord(**fields)


def _value(signer: Ed25519PrivateKey, payload: bytes, expires_at: float, dht_key: str = KEY) -> bytes:
    return seal(
        signer,
        domain=NODE_RECORD_DOMAIN,
        run_id=RUN,
        dht_key=dht_key,
        expires_at=expires_at,
        seq=1,
        payload=payload,
    )


def _dht_record(subject: bytes, value: object, expiration: float) -> DHTRecord:
    return DHTRecord(
        key=DHTID.generate(source=KEY).to_bytes(),
        subkey=MSGPackSerializer.dumps(signed_subkey(PeerID(subject).to_base58())),
        value=MSGPackSerializer.dumps(value),
        expiration_time=expiration,
    )


ALICE = Ed25519PrivateKey.generate()
A_ID = peer_id_from_private_key(ALICE)


def _valid() -> DHTRecord:
    expires = time.time() + 60
    return _dht_record(A_ID, _value(ALICE, _record(A_ID).to_payload(), expires), expires)


def _forgery(kind: str) -> DHTRecord:
    """One forged record of `kind`, about a fresh victim, so forgeries never overwrite each other."""
    victim, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    v_id, m_id = peer_id_from_private_key(victim), peer_id_from_private_key(mallory)
    soon, far = time.time() + 60, time.time() + 100 * MAX_NODE_RECORD_TTL_S
    if kind == "forged signature":  # Mallory signs a record and files it under the victim's subkey
        return _dht_record(v_id, _value(mallory, _record(v_id).to_payload(), soon), soon)
    if kind == "record about another peer":  # Mallory signs, under her own subkey, a record about the victim
        return _dht_record(m_id, _value(mallory, _record(v_id).to_payload(), soon), soon)
    if kind == "expiry too far ahead":
        return _dht_record(v_id, _value(victim, _record(v_id).to_payload(), far), far)
    if kind == "oversized value":
        return _dht_record(v_id, b"\x00" * (MAX_ENVELOPE_BYTES + 1000), soon)
    if kind == "value is an int":
        return _dht_record(v_id, 12345, soon)
    if kind == "value is a dict":
        return _dht_record(v_id, {"peer_id": "x"}, soon)
    if kind == "payload of wrong types":
        return _dht_record(v_id, _value(victim, b"\x0a\x05hello\x12\x07trainer\x12\x03bad", soon), soon)
    if kind == "signed for another key":
        other_key = "hivenet/v1/other/nodes"
        return _dht_record(v_id, _value(victim, _record(v_id).to_payload(), soon, dht_key=other_key), soon)
    raise AssertionError(kind)


FORGERIES = [
    "forged signature",
    "record about another peer",
    "expiry too far ahead",
    "oversized value",
    "value is an int",
    "value is a dict",
    "payload of wrong types",
    "signed for another key",
]


def test_valid_record_passes() -> None:
    check_signed_record(_valid())
    assert SignedRecordValidator().validate(_valid())


@pytest.mark.parametrize("kind", FORGERIES)
def test_forgery_is_rejected(kind: str) -> None:
    record = _forgery(kind)
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
def test_hivemind_unsigned_averager_declarations_are_refused(value: object) -> None:
    # anyone could write them under anyone's PeerID: hivenet's averagers sign theirs
    assert not SignedRecordValidator().validate(_unsigned(A_ID, value))


GROUP_KEY = "hivenet_diloco_validator-test.0b0"


def _declaration(
    signer: Ed25519PrivateKey, payload: bytes, *, key: str = GROUP_KEY, subkey_of: bytes | None = None
) -> DHTRecord:
    expires = time.time() + 30
    envelope = seal(
        signer,
        domain=AVERAGER_DECLARATION_DOMAIN,
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


def test_signed_averager_declarations_pass_and_forged_ones_are_refused() -> None:
    looking = declaration_payload(looking_for_group=True)
    assert SignedRecordValidator().validate(_declaration(ALICE, looking))
    assert SignedRecordValidator().validate(
        _declaration(ALICE, declaration_payload(shares_state=True, state_priority=7))
    )
    mallory = Ed25519PrivateKey.generate()
    # Mallory marks Alice as having left her group: signed by Mallory under Alice's subkey
    assert not SignedRecordValidator().validate(
        _declaration(mallory, declaration_payload(looking_for_group=False), subkey_of=A_ID)
    )
    # a declaration signed for another key, replayed under this one
    replayed = _declaration(ALICE, looking, key="hivenet_diloco_other.0b0")
    moved = DHTRecord(
        DHTID.generate(source=GROUP_KEY).to_bytes(), replayed.subkey, replayed.value, replayed.expiration_time
    )
    assert not SignedRecordValidator().validate(moved)
    # a priority that is not a finite step
    bad = pb.AveragerDeclaration(shares_state=True, state_priority=float("inf")).SerializeToString()
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
    record = _dht_record(A_ID, _value(ALICE, _record(A_ID).to_payload(), expires), expires + 1.0)
    assert not SignedRecordValidator().validate(record)


@pytest.fixture(scope="module")
def honest_and_attacker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[hivemind.DHT, hivemind.DHT]]:
    tmp: Path = tmp_path_factory.mktemp("dht")
    honest = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        record_validators=[SignedRecordValidator()],
        identity_path=str(create_identity(tmp / "honest.key").path),
        check_if_identity_free=False,
    )
    # the attacker runs no validator, so it will happily store and serve forged records
    attacker = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=honest.get_visible_maddrs(),
        identity_path=str(create_identity(tmp / "attacker.key").path),
        check_if_identity_free=False,
    )
    yield honest, attacker
    attacker.shutdown()
    honest.shutdown()


def test_forged_records_are_never_stored_or_returned(
    honest_and_attacker: tuple[hivemind.DHT, hivemind.DHT],
) -> None:
    honest, attacker = honest_and_attacker
    forgeries = []
    for kind in FORGERIES:
        record = _forgery(kind)
        subkey = MSGPackSerializer.loads(record.subkey)
        forgeries.append(subkey)
        attacker.store(
            KEY, MSGPackSerializer.loads(record.value), expiration_time=record.expiration_time, subkey=subkey
        )
    # the forgeries really are in the network: the attacker (no validator) serves them
    served = attacker.get(KEY, latest=True)
    assert served is not None and set(forgeries) <= set(served.value)
    good = _valid()
    good_subkey = MSGPackSerializer.loads(good.subkey)
    assert attacker.store(
        KEY, MSGPackSerializer.loads(good.value), expiration_time=good.expiration_time, subkey=good_subkey
    )

    def honest_sees_valid() -> bool:
        found = honest.get(KEY, latest=True)
        return found is not None and good_subkey in found.value

    assert wait_until(honest_sees_valid, timeout_s=20)
    found = honest.get(KEY, latest=True)
    assert found is not None
    assert set(found.value) == {good_subkey}, "a forged record was stored or returned"


def test_an_unsigned_plain_value_cannot_squat_a_key(
    honest_and_attacker: tuple[hivemind.DHT, hivemind.DHT],
) -> None:
    """A regular value with a far expiry would replace the key's dictionary of signed records."""
    honest, attacker = honest_and_attacker
    key = node_records_key("squatted-run")
    expires = time.time() + 60
    signed = seal(
        ALICE,
        domain=NODE_RECORD_DOMAIN,
        run_id="squatted-run",
        dht_key=key,
        expires_at=expires,
        seq=1,
        payload=_record(A_ID, run_id="squatted-run").to_payload(),
    )
    subkey = signed_subkey(PeerID(A_ID).to_base58())
    attacker.store(key, b"squatted", expiration_time=time.time() + 31 * 365 * 86400)
    honest.store(key, signed, expiration_time=expires, subkey=subkey)

    def honest_sees_the_record() -> bool:
        found = honest.get(key, latest=True)
        return found is not None and isinstance(found.value, dict) and subkey in found.value

    assert wait_until(honest_sees_the_record, timeout_s=20)
