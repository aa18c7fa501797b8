"""The guarded DHT protocol on real nodes: the sender of a malformed store request is banned (its
later, well-formed requests are refused too)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import hivemind
import pytest
from hivemind.dht.routing import DHTID

from node.dht_node import start_loopback_dht
from tests.helpers.dht_attacks import misaligned_store_request, send_raw_store, store_declaration

KEY = DHTID.generate(source="k").to_bytes()


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


@pytest.fixture(scope="module")
def honest_attacker_bystander() -> Iterator[tuple[hivemind.DHT, hivemind.DHT, hivemind.DHT]]:
    honest = start_loopback_dht()
    peers = [str(addr) for addr in honest.get_visible_maddrs()]
    attacker = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    bystander = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield honest, attacker, bystander
    for dht in (attacker, bystander, honest):
        dht.shutdown()
