"""Harness for weight-broadcast tests: an in-process swarm of hivemind DHTs on 127.0.0.1.

Each node is a real hivemind DHT with its own p2pd and the production record validator
(`node.dht_node.start_loopback_dht`), so streams, bans, kills and record checks are real; the
broadcast services run in the caller's event loop. Also small random state dicts and a
bounded `async_wait_until`; for attacks, a TCP listener standing in for a third party
(`ConnectionCounter`) and holder announcements from throwaway identities. torch is imported
only by the state-dict helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hivemind

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.dht_node import start_loopback_dht
from node.identity import Identity, create_identity
from node.signed_records import SignedRecords
from protocol.dht_keys import weights_holders_key
from protocol.manifest import WEIGHTS_HOLDER_DOMAIN, HolderAnnouncement, Manifest


@dataclass
class SwarmNode:
    """One peer of the test swarm: its identity and DHT (own p2pd)."""

    identity: Identity
    dht: hivemind.DHT


class Swarm:
    """Starts DHT nodes on loopback that bootstrap from the first one; shuts down what it started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[SwarmNode] = []

    def add(self) -> SwarmNode:
        identity = create_identity(self.root / f"node{len(self.nodes)}.key")
        initial_peers = [str(a) for a in self.nodes[0].dht.get_visible_maddrs()] if self.nodes else None
        dht = start_loopback_dht(initial_peers, identity=identity)
        node = SwarmNode(identity=identity, dht=dht)
        self.nodes.append(node)
        return node

    def kill(self, node: SwarmNode) -> None:
        with contextlib.suppress(Exception):
            node.dht.shutdown()

    def close(self) -> None:
        for node in self.nodes:
            self.kill(node)


def open_swarm(root: Path, num_nodes: int = 6) -> Iterator[Swarm]:
    """A seed and `num_nodes - 1` more peers; shut down when the generator is closed."""
    swarm = Swarm(root)
    try:
        for _ in range(num_nodes):
            swarm.add()
        yield swarm
    finally:
        swarm.close()


TEST_CHUNK_BYTES = 16 * 1024


def make_state_dict(seed: int, total_floats: int = 160_000) -> dict[str, Any]:
    """A small random state dict of mixed shapes and dtypes (about `4 * total_floats` bytes)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    quarter = total_floats // 4
    return {
        "embed.weight": torch.randn(quarter // 64, 64, generator=generator),
        "block.0.attn.weight": torch.randn(2 * quarter, generator=generator),
        "block.0.mlp.weight": torch.randn(quarter // 8, 8, generator=generator).to(torch.bfloat16),
        "head.bias": torch.arange(1000, dtype=torch.int64),
    }


def assert_state_dicts_equal(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Raise AssertionError unless both state dicts hold the same names, dtypes and values."""
    import torch

    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(left[name], right[name]), name


async def start_broadcast(
    node: SwarmNode, store_dir: Path, publishers: list[SwarmNode], **overrides: Any
) -> WeightBroadcast:
    """A WeightBroadcast for `node` with small chunks and fast retries (for tests)."""
    settings: dict[str, Any] = {
        "chunk_bytes": TEST_CHUNK_BYTES,
        "holder_refresh_s": 0.5,
        "request_timeout_s": 10.0,
        "retry_after_failure_s": 1.0,
    }
    config = BroadcastConfig(
        store_dir=store_dir,
        authorized_publishers=[p.identity.peer_id.to_base58() for p in publishers],
        **(settings | overrides),
    )
    broadcast = WeightBroadcast(dht=node.dht, identity=node.identity, config=config)
    await broadcast.start()
    return broadcast


class ConnectionCounter:
    """A TCP listener on loopback standing in for a third party: counts the connections it receives."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        """Start listening; return the listener's multiaddr."""

        async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"/ip4/127.0.0.1/tcp/{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def announce_fake_holders(
    dht: hivemind.DHT, key_dir: Path, manifest: Manifest, addresses: tuple[str, ...], count: int
) -> list[Identity]:
    """Store holder announcements of `manifest`'s version from `count` throwaway identities, each
    claiming to hold every chunk at `addresses` (signed properly: the DHT accepts them)."""
    identities = []
    for index in range(count):
        identity = create_identity(key_dir / f"throwaway{index}.key")
        announcement = HolderAnnouncement(
            run_id=manifest.run_id,
            version=manifest.version,
            content_id=manifest.content_id,
            chunks_held=manifest.num_chunks,
            num_chunks=manifest.num_chunks,
            addresses=addresses,
        )
        stored = await SignedRecords(dht, identity).store(
            weights_holders_key(manifest.run_id, manifest.version),
            domain=WEIGHTS_HOLDER_DOMAIN,
            run_id=manifest.run_id,
            payload=announcement.to_payload(),
            ttl_s=60.0,
        )
        assert stored
        identities.append(identity)
    return identities


async def store_in_caches(
    _dht: Any, node: Any, key: str, records: list[tuple[str, bytes, float]], targets: list[Any]
) -> list[bool]:
    """Store (subkey, raw value, expiration) records under `key` in the *cache* of each target peer, as
    hivemind's caching of found values does (run in an attacker's DHT process via `run_coroutine`)."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils.serializer import MSGPackSerializer

    key_id = DHTID.generate(source=key)
    results = []
    for target in targets:
        outcome = await node.protocol.call_store(
            target,
            [key_id] * len(records),
            [MSGPackSerializer.dumps(value) for _, value, _ in records],
            [expiration for _, _, expiration in records],
            subkeys=[subkey for subkey, _, _ in records],
            in_cache=True,
        )
        results.append(bool(outcome) and all(outcome))
    return results
