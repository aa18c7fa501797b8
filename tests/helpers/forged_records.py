"""Signed node records as they sit in the DHT, and forgeries of every kind (for record validator tests)."""

from __future__ import annotations

import secrets
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from protocol.dht_keys import node_records_key, signed_subkey
from protocol.envelope import seal
from protocol.limits import MAX_ENVELOPE_BYTES, MAX_NODE_RECORD_TTL_S
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, Role
from protocol.peer_keys import peer_id_from_private_key

RUN = "validator-test"
KEY = node_records_key(RUN)


def node_record(peer_id: bytes, **overrides: object) -> NodeRecord:
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


def sealed_value(signer: Ed25519PrivateKey, payload: bytes, expires_at: float, dht_key: str = KEY) -> bytes:
    return seal(
        signer,
        domain=NODE_RECORD_DOMAIN,
        run_id=RUN,
        dht_key=dht_key,
        expires_at=expires_at,
        seq=1,
        payload=payload,
    )


def dht_record(subject: bytes, value: object, expiration: float) -> DHTRecord:
    return DHTRecord(
        key=DHTID.generate(source=KEY).to_bytes(),
        subkey=MSGPackSerializer.dumps(signed_subkey(PeerID(subject).to_base58())),
        value=MSGPackSerializer.dumps(value),
        expiration_time=expiration,
    )


ALICE = Ed25519PrivateKey.generate()
A_ID = peer_id_from_private_key(ALICE)


def valid_record() -> DHTRecord:
    expires = time.time() + 60
    return dht_record(A_ID, sealed_value(ALICE, node_record(A_ID).to_payload(), expires), expires)


def forgery(kind: str) -> DHTRecord:
    """One forged record of `kind`, about a fresh victim, so forgeries never overwrite each other."""
    victim, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    v_id, m_id = peer_id_from_private_key(victim), peer_id_from_private_key(mallory)
    soon, far = time.time() + 60, time.time() + 100 * MAX_NODE_RECORD_TTL_S
    if kind == "forged signature":  # Mallory signs a record and files it under the victim's subkey
        return dht_record(v_id, sealed_value(mallory, node_record(v_id).to_payload(), soon), soon)
    if kind == "record about another peer":  # Mallory signs, under her own subkey, a record about the victim
        return dht_record(m_id, sealed_value(mallory, node_record(v_id).to_payload(), soon), soon)
    if kind == "expiry too far ahead":
        return dht_record(v_id, sealed_value(victim, node_record(v_id).to_payload(), far), far)
    if kind == "oversized value":
        return dht_record(v_id, b"\x00" * (MAX_ENVELOPE_BYTES + 1000), soon)
    if kind == "value is an int":
        return dht_record(v_id, 12345, soon)
    if kind == "value is a dict":
        return dht_record(v_id, {"peer_id": "x"}, soon)
    if kind == "payload of wrong types":
        return dht_record(v_id, sealed_value(victim, b"\x0a\x05hello\x12\x07trainer\x12\x03bad", soon), soon)
    if kind == "signed for another key":
        other_key = "hivenet/v1/other/nodes"
        return dht_record(
            v_id, sealed_value(victim, node_record(v_id).to_payload(), soon, dht_key=other_key), soon
        )
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
