"""The weight broadcast counts into its node's metrics: chunks and bytes served and fetched, bans by reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.metrics import NodeMetrics
from tests.helpers.broadcast import TEST_CHUNK_BYTES, Swarm, SwarmNode, make_state_dict


async def _broadcast(
    node: SwarmNode, store: Path, publisher: SwarmNode, metrics: NodeMetrics
) -> WeightBroadcast:
    config = BroadcastConfig(
        store_dir=store,
        authorized_publishers=[publisher.identity.peer_id.to_base58()],
        chunk_bytes=TEST_CHUNK_BYTES,
        holder_refresh_s=0.5,
        request_timeout_s=10.0,
        retry_after_failure_s=1.0,
    )
    broadcast = WeightBroadcast(dht=node.dht, identity=node.identity, config=config, metrics=metrics)
    await broadcast.start()
    return broadcast


def test_publisher_and_fetcher_count_chunks_bytes_and_bans(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    publisher_node, fetcher_node = swarm.add(), swarm.add()
    served, fetched = NodeMetrics(), NodeMetrics()

    async def main() -> None:
        publisher = await _broadcast(publisher_node, tmp_path / "pub", publisher_node, served)
        fetcher = await _broadcast(fetcher_node, tmp_path / "fetch", publisher_node, fetched)
        try:
            manifest = await publisher.publish("metrics", 1, make_state_dict(seed=3, total_floats=40_000))
            await fetcher.fetch("metrics")
            publisher_figures, fetcher_figures = served.figures(), fetched.figures()
            assert manifest.num_chunks > 1
            assert fetcher_figures.chunks_fetched == manifest.num_chunks
            assert fetcher_figures.bytes_received["broadcast"] >= manifest.total_bytes
            assert publisher_figures.chunks_served == manifest.num_chunks  # the only source
            assert publisher_figures.bytes_sent["broadcast"] > manifest.total_bytes  # chunks and the manifest
            assert fetcher_figures.chunks_served == 0 and publisher_figures.chunks_fetched == 0

            fetcher.bans.ban(publisher_node.identity.peer_id, "bad chunk: hash mismatch")
            assert fetched.figures().bans == {"bad chunk": 1} and served.figures().bans == {}
        finally:
            await fetcher.stop()
            await publisher.stop()

    try:
        asyncio.run(main())
    finally:
        swarm.close()
