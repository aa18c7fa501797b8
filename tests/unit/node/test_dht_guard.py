"""The guarded DHT protocol: malformed store requests are refused without hitting hivemind's asserts,
and their sender is banned (its later, well-formed requests are refused too)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import hivemind
import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from node.dht_guard import MAX_STORE_VALUE_BYTES, store_request_problem
from node.dht_node import start_loopback_dht
from tests.helpers.dht_attacks import misaligned_store_request, send_raw_store, store_declaration

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


@pytest.fixture(scope="module")
def honest_attacker_bystander() -> Iterator[tuple[hivemind.DHT, hivemind.DHT, hivemind.DHT]]:
    honest = start_loopback_dht()
    peers = [str(addr) for addr in honest.get_visible_maddrs()]
    attacker = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    bystander = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield honest, attacker, bystander
    for dht in (attacker, bystander, honest):
        dht.shutdown()


def test_a_malformed_store_bans_its_sender(
    honest_attacker_bystander: tuple[hivemind.DHT, hivemind.DHT, hivemind.DHT],
) -> None:
    honest, attacker, bystander = honest_attacker_bystander
    target = honest.peer_id
    answer = attacker.run_coroutine(
        partial(send_raw_store, target=target, request=misaligned_store_request("guarded")),
        return_future=True,
    ).result(timeout=60)
    assert answer.startswith("store_ok"), answer  # answered, not a handler crash
    refused = attacker.run_coroutine(
        partial(store_declaration, target=target, key="after-ban"), return_future=True
    ).result(timeout=60)
    accepted = bystander.run_coroutine(
        partial(store_declaration, target=target, key="after-ban"), return_future=True
    ).result(timeout=60)
    assert refused == [False], "a banned sender's store was accepted"
    assert accepted == [True], "an honest sender was refused"
