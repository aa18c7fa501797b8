"""Holder announcements cannot aim fetchers at third parties (issue 12, build item 4): a fetcher
dials a holder only when it picks it as a source, considers a capped number of holders, and
dials an address claimed by many throwaway identities rarely."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.dialing import dialable
from node.dialable import parse_networks
from tests.helpers.broadcast import (
    ConnectionCounter,
    Swarm,
    announce_fake_holders,
    assert_state_dicts_equal,
    make_state_dict,
    open_swarm,
    start_broadcast,
)
from tests.helpers.waiting import async_wait_until


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"), num_nodes=4)


async def _dials_ended(fetcher: WeightBroadcast) -> None:
    """Wait until every dial the fetcher started has ended: the victim has seen whatever reached it."""
    await async_wait_until(lambda: fetcher.dialer.finished == fetcher.dialer.attempts, timeout_s=30)


def test_holders_not_picked_as_sources_are_never_dialled(swarm: Swarm, tmp_path: Path) -> None:
    publisher, fetcher_node = swarm.nodes[1], swarm.nodes[2]

    async def main() -> None:
        victim = ConnectionCounter()
        victim_address = await victim.start()
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        fetcher = await start_broadcast(fetcher_node, tmp_path / "fetcher", [publisher], max_sources=1)
        try:
            state = make_state_dict(seed=41, total_floats=40_000)
            manifest = await pub.publish("dial", 1, state)
            await announce_fake_holders(swarm.nodes[3].dht, tmp_path, manifest, (victim_address,), count=5)
            assert len(await fetcher.records.find_holders("dial", 1, manifest.content_id)) == 6
            await asyncio.wait_for(fetcher.fetch("dial"), timeout=60)  # the publisher is the one source
            assert_state_dicts_equal(await fetcher.load("dial", 1), state)
            await _dials_ended(fetcher)
            assert victim.connections == 0
        finally:
            victim.close()
            for b in (pub, fetcher):
                await b.stop()

    asyncio.run(main())


def test_an_address_claimed_by_many_throwaway_holders_is_dialled_at_most_once(
    swarm: Swarm, tmp_path: Path
) -> None:
    publisher, fetcher_node = swarm.nodes[1], swarm.nodes[2]

    async def main() -> None:
        victim = ConnectionCounter()
        victim_address = await victim.start()
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=200_000)
        fetcher = await start_broadcast(fetcher_node, tmp_path / "fetcher", [publisher])
        try:
            state = make_state_dict(seed=42)
            manifest = await pub.publish("dialmany", 1, state)
            await announce_fake_holders(swarm.nodes[3].dht, tmp_path, manifest, (victim_address,), count=5)
            await asyncio.wait_for(fetcher.fetch("dialmany"), timeout=60)  # ~3 s: several holder refreshes
            assert_state_dicts_equal(await fetcher.load("dialmany", 1), state)
            await _dials_ended(fetcher)
            assert victim.connections == 1  # picked as a source: dialled, but once for all five claimants
        finally:
            victim.close()
            for b in (pub, fetcher):
                await b.stop()

    asyncio.run(main())


def test_holders_considered_per_refresh_are_capped(swarm: Swarm, tmp_path: Path) -> None:
    publisher, fetcher_node = swarm.nodes[1], swarm.nodes[2]

    async def main() -> None:
        victims = [ConnectionCounter() for _ in range(6)]
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=200_000)
        fetcher = await start_broadcast(
            fetcher_node, tmp_path / "fetcher", [publisher], max_holders_considered=2, holder_refresh_s=120.0
        )
        try:
            state = make_state_dict(seed=43)
            manifest = await pub.publish("dialcap", 1, state)
            for index, victim in enumerate(victims):
                address = await victim.start()
                await announce_fake_holders(
                    swarm.nodes[3].dht, tmp_path / f"v{index}", manifest, (address,), count=1
                )
            await asyncio.wait_for(fetcher.fetch("dialcap"), timeout=60)  # one holder refresh only
            assert_state_dicts_equal(await fetcher.load("dialcap", 1), state)
            await _dials_ended(fetcher)
            assert sum(v.connections for v in victims) == 2
        finally:
            for victim in victims:
                victim.close()
            for b in (pub, fetcher):
                await b.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("address", "allow_private", "expected"),
    [
        ("/ip4/8.8.8.8/tcp/4001", False, "/ip4/8.8.8.8/tcp/4001"),
        ("/ip4/8.8.8.8/udp/4001/quic", False, "/ip4/8.8.8.8/udp/4001/quic"),
        ("/ip4/127.0.0.1/tcp/4001", False, None),
        ("/ip4/10.0.0.7/tcp/4001", False, None),
        ("/ip4/169.254.1.1/tcp/4001", False, None),
        ("/ip4/127.0.0.1/tcp/4001", True, "/ip4/127.0.0.1/tcp/4001"),
        ("/dns4/example.com/tcp/4001", True, None),
        ("/ip4/8.8.8.8/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", True, None),
        ("/ip4/8.8.8.8/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N/p2p-circuit", True, None),
        ("not a multiaddr", True, None),
    ],
)
def test_only_plain_addresses_are_dialled(address: str, allow_private: bool, expected: str | None) -> None:
    assert dialable(address, allow_private=allow_private) == expected


def test_addresses_in_the_operators_dialable_networks_are_dialled_and_only_those() -> None:
    networks = parse_networks(["10.77.0.0/16"])
    assert (
        dialable("/ip4/10.77.0.12/tcp/4001", allow_private=False, networks=networks)
        == "/ip4/10.77.0.12/tcp/4001"
    )
    assert dialable("/ip4/10.78.0.12/tcp/4001", allow_private=False, networks=networks) is None
    assert dialable("/ip4/127.0.0.1/tcp/4001", allow_private=False, networks=networks) is None
