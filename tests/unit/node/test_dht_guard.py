"""The guarded DHT protocol's request check: malformed store requests are named before hivemind touches them."""

from __future__ import annotations

import time

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from node.dht_guard import MAX_STORE_VALUE_BYTES, store_request_problem

KEY = DHTID.generate(source="k").to_bytes()


def _request(n: int = 1, **overrides: list) -> dht_pb2.StoreRequest:
    fields: dict = dict(
        keys=[KEY] * n,
        subkeys=[MSGPackSerializer.dumps(b"\x00\x02ab")] * n,
        values=[MSGPackSerializer.dumps(1.0)] * n,
        expiration_time=[time.time() + 30] * n,
        in_cache=[False] * n,
    )
    fields.update(overrides)
    return dht_pb2.StoreRequest(**fields)


def test_a_well_formed_request_passes() -> None:
    assert store_request_problem(_request(3)) is None
    # hivemind hands a new neighbour every record it should hold in one request: no count limit
    # (p2pd's message size bounds it), or honest nodes holding many records get banned
    assert store_request_problem(_request(500)) is None
    dictionary = DictionaryDHTValue()
    dictionary.store(b"sub", b"v", time.time() + 30)
    whole = _request(subkeys=[DHTProtocol.IS_DICTIONARY], values=[MSGPackSerializer.dumps(dictionary)])
    assert store_request_problem(whole) is None  # hivemind caches found dictionaries on nearby nodes


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (_request(2, values=[b"x"]), "misaligned"),
        (_request(keys=[b"short"]), "key of 5 bytes"),
        (_request(values=[b"x" * (MAX_STORE_VALUE_BYTES + 1)]), "oversized value"),
        (_request(subkeys=[b"\xc1"]), "undecodable subkey"),
        (
            _request(subkeys=[DHTProtocol.IS_DICTIONARY], values=[MSGPackSerializer.dumps(1.0)]),
            "not a dictionary",
        ),
        (_request(subkeys=[DHTProtocol.IS_DICTIONARY], values=[b"\xc1"]), "undecodable dictionary"),
    ],
)
def test_malformed_requests_are_named(request_: dht_pb2.StoreRequest, problem: str) -> None:
    found = store_request_problem(request_)
    assert found is not None and problem in found
