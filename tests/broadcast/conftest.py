"""Fixtures for the weight-broadcast tests: a small local swarm of hivemind DHTs on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hivemind
import pytest

from node.identity import Identity, create_identity
from protocol.record_validator import SignedRecordValidator


async def async_wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> None:
    """Wait (yielding to the event loop) until `predicate()` holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


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
        dht = hivemind.DHT(
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            initial_peers=initial_peers,
            record_validators=[SignedRecordValidator()],
            identity_path=str(identity.path),
            check_if_identity_free=False,
            start=True,
        )
        node = SwarmNode(identity=identity, dht=dht)
        self.nodes.append(node)
        return node

    def kill(self, node: SwarmNode) -> None:
        with contextlib.suppress(Exception):
            node.dht.shutdown()

    def close(self) -> None:
        for node in self.nodes:
            self.kill(node)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    """A seed, a publisher and four more peers, shared by the tests of one module."""
    swarm = Swarm(tmp_path_factory.mktemp("swarm"))
    try:
        for _ in range(6):
            swarm.add()
        yield swarm
    finally:
        swarm.close()
