"""Two publishers of bit-identical weights share one content id, so their holders serve each other's fetchers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.broadcast.errors import WeightsUnavailable
from node.broadcast.manifest_fetch import call_manifest
from tests.helpers.broadcast import (
    Swarm,
    assert_state_dicts_equal,
    make_state_dict,
    open_swarm,
    start_broadcast,
)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("shared"), num_nodes=5)


def test_a_fetcher_trusting_one_publisher_downloads_from_the_other_publishers_holder(
    swarm: Swarm, tmp_path: Path
) -> None:
    alice_node, bob_node, fetcher_node, late_node = swarm.nodes[1:5]
    alice_id, bob_id = alice_node.identity.peer_id, bob_node.identity.peer_id

    async def main() -> None:
        alice = await start_broadcast(alice_node, tmp_path / "alice", [alice_node, bob_node])
        bob = await start_broadcast(bob_node, tmp_path / "bob", [alice_node, bob_node])
        fetcher = await start_broadcast(fetcher_node, tmp_path / "fetcher", [alice_node])
        late = await start_broadcast(late_node, tmp_path / "late", [alice_node])
        alice_service = alice.service
        try:
            state = make_state_dict(seed=11)
            by_alice = await alice.publish("shared", 1, state)
            by_bob = await bob.publish("shared", 1, state)
            assert by_alice.raw != by_bob.raw and by_alice.publisher != by_bob.publisher
            assert by_alice.content_id == by_bob.content_id

            # both publications are found as holders of the one content
            holders = await fetcher.records.find_holders("shared", 1, by_alice.content_id)
            assert {h.peer_id for h in holders} == {alice_id, bob_id}

            # the fetcher (trusting alice only) gets alice's manifest, the first step of a fetch ...
            pointer = await fetcher.records.find_pointer("shared", 1)
            assert pointer is not None and pointer.publisher == alice_id.to_bytes()
            manifest = await call_manifest(
                fetcher.p2p, alice_id, pointer, authorized=fetcher.authorized, timeout_s=10.0
            )
            fetcher.store.create(manifest)
            # ... then alice stops serving before a single chunk has left her (her DHT node, and so
            # her pointer, stays up)
            await alice.stop()

            # bob serves only his own manifest, which a peer trusting alice only cannot use: it
            # finds no manifest, and does not hold that against bob
            with pytest.raises(WeightsUnavailable):
                await late.fetch("shared", 1, manifest_timeout_s=2.0)
            assert not late.bans.is_banned(bob_id)

            # every chunk comes from bob, who only ever held his own publication
            entry = await fetcher.fetch("shared", 1)
            assert entry.complete and entry.manifest.publisher == alice_id.to_bytes()
            assert_state_dicts_equal(await fetcher.load("shared", 1), state)
            assert alice_service.uploaded_bytes == len(by_alice.raw)
            assert bob.service.uploaded_bytes >= by_bob.total_bytes
            assert not fetcher.bans.is_banned(bob_id)

            # now the fetcher serves alice's manifest too: the late peer completes from it and bob
            late_entry = await late.fetch("shared", 1)
            assert late_entry.complete and late_entry.manifest.publisher == alice_id.to_bytes()
            assert_state_dicts_equal(await late.load("shared", 1), state)
        finally:
            for broadcast in (alice, bob, fetcher, late):
                await broadcast.stop()

    asyncio.run(main())
