"""Integration tests of the weight broadcast on a local swarm of real p2pd daemons."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broadcast.conftest import Swarm
from tests.broadcast.helpers import assert_state_dicts_equal, make_state_dict, start_broadcast


def test_round_trip_publisher_and_three_fetchers(swarm: Swarm, tmp_path: Path) -> None:
    publisher, *fetchers = swarm.nodes[1:5]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=2_000_000)
        peers = [
            await start_broadcast(node, tmp_path / f"f{i}", [publisher]) for i, node in enumerate(fetchers)
        ]
        try:
            state = make_state_dict(seed=1)
            manifest = await pub.publish("roundtrip", 1, state)
            entries = await asyncio.gather(*(peer.fetch("roundtrip") for peer in peers))
            for peer, entry in zip(peers, entries, strict=True):
                assert entry.version == 1 and entry.complete
                assert entry.manifest.sha256 == manifest.sha256
                assert_state_dicts_equal(await peer.load("roundtrip", 1), state)
            # fetchers served each other: the publisher's upload is not the only one used
            assert sum(peer.service.uploaded_bytes for peer in peers) > 0
            statuses = await peers[0].status("roundtrip")
            assert [s.version for s in statuses] == [1]
            assert statuses[0].local_chunks == manifest.num_chunks
        finally:
            for b in (pub, *peers):
                await b.shutdown()

    asyncio.run(main())
