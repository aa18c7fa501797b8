"""A flood of valid records from fresh identities under one key hides no honest node (issue 30, item 7).

On 127.0.0.1: a seed and two honest members with the production guard, whose records the seed has
seen long enough to hold them established (the test shortens `established_s` to a second and
waits until the seed says so). An attacker with a plain hivemind node then stores 1,100 valid node
records of 4 KiB, each signed by a fresh key, under the run's node-records key at every honest
node: the flood that once made the key's dictionary too large for a p2pd message, so that every
lookup failed (and, in the slow tier, 10,000 more). Afterwards a newcomer's lookup lists both honest members, no honest node holds more than the
per-key cap, and no honest node banned another for relaying what it found.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import hivemind
import pytest
from click.testing import CliRunner

from cli.main import cli
from node.dht_node import start_loopback_dht
from node.dht_quota import QuotaLimits, Standing
from node.identity import Identity, create_identity
from node.membership import fetch_run_records
from node.swarm import wait_until
from protocol.dht_keys import node_records_key
from tests.helpers.dht_attacks import bans_issued, standing_tier, store_sybil_records, stored_under
from tests.helpers.members import validator_membership

RUN = "flooded-run"
LIMITS = QuotaLimits(established_s=1.0)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[hivemind.DHT], list[Identity]]]:
    root: Path = tmp_path_factory.mktemp("flood")
    seed = start_loopback_dht(quota_limits=LIMITS)
    peers = [str(addr) for addr in seed.get_visible_maddrs()]
    identities = [create_identity(root / f"member{i}.key") for i in range(2)]
    members = [start_loopback_dht(peers, identity=i, quota_limits=LIMITS) for i in identities]
    try:
        yield [seed, *members], identities
    finally:
        for dht in (*members, seed):
            dht.shutdown()


def _tier(dht: hivemind.DHT, owner: bytes) -> int:
    return int(dht.run_coroutine(partial(standing_tier, owner=owner), return_future=True).result(timeout=30))


@pytest.mark.parametrize("sybils", [1100, pytest.param(10_000, marks=pytest.mark.slow)])
def test_a_subkey_flood_hides_no_established_honest_node(
    swarm: tuple[list[hivemind.DHT], list[Identity]], sybils: int
) -> None:
    nodes, identities = swarm
    seed, members = nodes[0], nodes[1:]
    memberships = [
        validator_membership(dht, identity, RUN, public_name="honest", record_ttl_s=240.0)
        for dht, identity in zip(members, identities, strict=True)
    ]
    owners = [identity.peer_id.to_bytes() for identity in identities]

    def established() -> bool:  # each refresh is a sighting; the seed promotes after established_s
        for membership in memberships:
            asyncio.run(membership.publish())
        return all(_tier(seed, owner) == Standing.ESTABLISHED for owner in owners)

    assert wait_until(established, timeout_s=60, interval_s=0.5), (
        "the seed never held the members established"
    )

    key = node_records_key(RUN)
    attacker = hivemind.DHT(start=True, initial_peers=[str(a) for a in seed.get_visible_maddrs()])
    try:
        stored = attacker.run_coroutine(
            partial(store_sybil_records, targets=[dht.peer_id for dht in nodes], run_id=RUN, count=sybils),
            return_future=True,
        ).result(timeout=240)
    finally:
        attacker.shutdown()
    assert stored > 0, "no sybil record was stored at all: the attack did not run"

    newcomer = start_loopback_dht([str(a) for a in seed.get_visible_maddrs()])
    try:
        listed = asyncio.run(fetch_run_records(newcomer, RUN))
    finally:
        newcomer.shutdown()
    assert set(owners) <= set(listed), f"{len(set(owners) & set(listed))} of 2 honest members listed"
    # and so does `hivenet peers`, as an operator runs it
    seed_address = str(seed.get_visible_maddrs()[0])
    result = CliRunner().invoke(cli, ["peers", "--initial-peers", seed_address, "--run", RUN, "--json"])
    assert result.exit_code == 0, result.output
    shown = {row["peer_id"] for row in json.loads(result.output[result.output.index("[") :])}
    assert {identity.peer_id.to_base58() for identity in identities} <= shown
    for dht in nodes:
        held = dht.run_coroutine(partial(stored_under, key=key), return_future=True).result(timeout=30)
        assert held <= 2 * (LIMITS.max_per_key + 1), f"a node holds {held} records under the flooded key"
        bans = dht.run_coroutine(bans_issued, return_future=True).result(timeout=30)
        assert not bans, f"an honest node banned a peer: {bans}"
