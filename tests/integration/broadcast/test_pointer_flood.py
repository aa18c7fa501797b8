"""A flood of valid weights pointers from fresh identities hides no version (issue 30, item 7).

On 127.0.0.1: a publisher and a follower whose DHT holds the publisher as one of the run's signers
(as a worker started with `--publisher` does). After the publisher's v1, an attacker stores 10,000
valid pointers under the run's `latest` key at both, each signed by a fresh key that names itself
the publisher of a later version. The follower still finds v1 from its publisher, the next version
the publisher announces lands, and no honest node banned the other for relaying what it found.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import hivemind
import pytest

from node.dht_node import start_loopback_dht
from node.identity import create_identity
from protocol.dht_keys import weights_pointer_key
from tests.helpers.broadcast import SwarmNode, make_state_dict, start_broadcast
from tests.helpers.dht_attacks import bans_issued, store_sybil_pointers, stored_under

RUN = "pointer-flood"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_thousand_sybil_pointers_hide_no_version(tmp_path: Path) -> None:
    publisher_id = create_identity(tmp_path / "publisher.key")
    follower_id = create_identity(tmp_path / "follower.key")
    publisher_dht = start_loopback_dht(identity=publisher_id)
    peers = [str(a) for a in publisher_dht.get_visible_maddrs()]
    follower_dht = start_loopback_dht(
        peers, identity=follower_id, trusted_owners=frozenset({publisher_id.peer_id.to_bytes()})
    )
    nodes = [
        SwarmNode(identity=publisher_id, dht=publisher_dht),
        SwarmNode(identity=follower_id, dht=follower_dht),
    ]
    try:
        asyncio.run(_flood_between_versions(nodes, tmp_path, peers))
        for dht in (publisher_dht, follower_dht):
            held = dht.run_coroutine(
                partial(stored_under, key=weights_pointer_key(RUN)), return_future=True
            ).result(30)
            assert held <= 2 * 1025, f"a node holds {held} pointers under `latest`"
            assert not dht.run_coroutine(bans_issued, return_future=True).result(30)
    finally:
        follower_dht.shutdown()
        publisher_dht.shutdown()


async def _flood_between_versions(nodes: list[SwarmNode], root: Path, peers: list[str]) -> None:
    publisher_node, follower_node = nodes
    publisher = await start_broadcast(publisher_node, root / "publisher", [publisher_node])
    follower = await start_broadcast(follower_node, root / "follower", [publisher_node])
    try:
        await publisher.publish(RUN, 1, make_state_dict(seed=1, total_floats=4096))
        attacker = hivemind.DHT(start=True, initial_peers=peers)
        try:
            targets = [node.dht.peer_id for node in nodes]
            stored = await attacker.run_coroutine(
                partial(store_sybil_pointers, targets=targets, run_id=RUN, count=10_000), return_future=True
            )
        finally:
            attacker.shutdown()
        assert stored > 0, "the flood stored nothing: the attack did not run"
        found = await follower.records.find_pointer(RUN)
        assert found is not None and found.version == 1, found
        await publisher.publish(RUN, 2, make_state_dict(seed=2, total_floats=4096))
        entry = await asyncio.wait_for(follower.fetch(RUN, manifest_timeout_s=10.0), timeout=120)
        assert entry.version == 2
    finally:
        await follower.stop()
        await publisher.stop()
