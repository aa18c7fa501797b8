"""Part 4 of `bench/robustness.py`: floods of valid DHT records from fresh identities.

On 127.0.0.1, against the production guard and storage quota (`node.dht_quota`), from a plain
hivemind node that signs every record with a fresh key (`tests.helpers.dht_attacks`):

* **Memory**: 100,000 node records of 4 KiB (20,000 with `--quick`), a hundred under each of many
  runs' keys, stored at one honest DHT node. Reported: `dht_flood_rss_growth_mib`, the growth of
  that node's DHT process RSS (target <= 64), and how many it kept.
* **One key**: a seed and two honest members whose records the seed holds as established (the
  benchmark shortens `established_s` to 2 s; in a live run, 5 minutes), then 1,100 and (without
  `--quick`) 10,000 more sybil records under the run's node-records key at every honest node; a
  newcomer's lookup must list both members. Reported: `subkey_flood_nodes_listed_frac` (target 1),
  and the same for two members that joined just before the flood and are flushed by it, after their
  next refresh (`subkey_flood_newcomers_listed_frac`).
* **The matchmaking key**: two trainers' averaging services (`GatherAverager`) average one clean
  round, then one with 1,100 valid round declarations for its step from sybils with no host behind
  them, then one more that the same sybils declare again. Reported: the flooded rounds in which the
  two averaged with each other (`declaration_flood_rounds_averaged`, target 2/2) and each flooded
  round's time over the clean one's (`declaration_flood_round_ratio`, then
  `declaration_flood_next_round_ratio`: the sybils are passed over).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from functools import partial
from pathlib import Path

import hivemind
import psutil
import torch

from node.dht_node import start_loopback_dht
from node.dht_quota import QuotaLimits, Standing
from node.identity import create_identity
from node.membership import Membership, fetch_run_records
from node.swarm import wait_until
from tests.helpers.dht_attacks import flood_many_runs, standing_tier, store_sybil_records
from tests.helpers.gather import SHAPES, averaged_together, dht_of, flood_declarations, gather_swarm
from tests.helpers.members import validator_membership

MIB = 2**20
BENCH_LIMITS = QuotaLimits(established_s=2.0)


def _rss(dht: hivemind.DHT) -> int:
    assert dht.pid is not None
    return int(psutil.Process(dht.pid).memory_info().rss)


def memory_flood(records: int) -> dict[str, str]:
    honest = start_loopback_dht()
    attacker = hivemind.DHT(start=True, initial_peers=[str(a) for a in honest.get_visible_maddrs()])
    try:
        before = _rss(honest)
        started = time.monotonic()
        stored = attacker.run_coroutine(
            partial(flood_many_runs, target=honest.peer_id, runs=records // 100, per_run=100, prefix="flood"),
            return_future=True,
        ).result(timeout=1800)
        growth = (_rss(honest) - before) / MIB
        print(f"memory flood: {records} records of 4 KiB from fresh keys in {time.monotonic() - started:.0f} s, "
              f"{stored} stores accepted (the quota evicts newcomers first); DHT process RSS +{growth:.1f} MiB")  # fmt: skip
    finally:
        attacker.shutdown()
        honest.shutdown()
    return {"dht_flood_records": str(records), "dht_flood_rss_growth_mib": f"{growth:.1f}"}


def _members(seed: hivemind.DHT, root: Path, run_id: str, nodes: list[hivemind.DHT]) -> list[Membership]:
    """Two honest members of `run_id` joined to `seed` (their DHTs appended to `nodes`)."""
    memberships = []
    for index in range(2):
        identity = create_identity(root / f"{run_id}-{index}.key")
        peers = [str(a) for a in seed.get_visible_maddrs()]
        member = start_loopback_dht(peers, identity=identity, quota_limits=BENCH_LIMITS)
        nodes.append(member)
        memberships.append(
            validator_membership(member, identity, run_id, public_name="honest", record_ttl_s=240.0)
        )
    return memberships


def _listed_frac(seed: hivemind.DHT, run_id: str, memberships: list[Membership]) -> float:
    newcomer = start_loopback_dht([str(a) for a in seed.get_visible_maddrs()])
    try:
        listed = asyncio.run(fetch_run_records(newcomer, run_id))
    finally:
        newcomer.shutdown()
    honest = {m.identity.peer_id.to_bytes() for m in memberships}
    return len(honest & set(listed)) / len(honest)


def _flood(nodes: list[hivemind.DHT], run_id: str, count: int) -> int:
    attacker = hivemind.DHT(start=True, initial_peers=[str(a) for a in nodes[0].get_visible_maddrs()])
    try:
        return int(
            attacker.run_coroutine(
                partial(store_sybil_records, targets=[d.peer_id for d in nodes], run_id=run_id, count=count),
                return_future=True,
            ).result(timeout=1800)
        )
    finally:
        attacker.shutdown()


def subkey_flood(counts: list[int]) -> dict[str, str]:
    seed = start_loopback_dht(quota_limits=BENCH_LIMITS)
    nodes = [seed]
    fields: dict[str, str] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-flood-") as scratch:
            elders = _members(seed, Path(scratch), "flooded", nodes)

            def established() -> bool:
                for member in elders:
                    asyncio.run(member.publish())
                tiers = [
                    seed.run_coroutine(partial(standing_tier, owner=m.identity.peer_id.to_bytes()), return_future=True).result(30)
                    for m in elders
                ]  # fmt: skip
                return all(tier == Standing.ESTABLISHED for tier in tiers)

            if not wait_until(established, timeout_s=120, interval_s=0.5):
                raise RuntimeError("the seed never held the members established")
            fracs = []
            for count in counts:
                stored = _flood(nodes, "flooded", count)
                frac = _listed_frac(seed, "flooded", elders)
                fracs.append(frac)
                print(f"one-key flood: {count} sybil records at {len(nodes)} honest nodes ({stored} stores accepted): "
                      f"{frac:.0%} of the established members listed by a newcomer")  # fmt: skip
            fields["subkey_flood_nodes_listed_frac"] = f"{min(fracs):.2f}"

            fresh = _members(seed, Path(scratch), "flooded-fresh", nodes)
            for member in fresh:
                asyncio.run(member.publish())
            _flood(nodes, "flooded-fresh", counts[0])
            for member in fresh:  # their next refresh, after the flood flushed them
                asyncio.run(member.publish())
            frac = _listed_frac(seed, "flooded-fresh", fresh)
            print(
                f"one-key flood on newcomers: {counts[0]} sybil records, then one refresh: {frac:.0%} listed"
            )
            fields["subkey_flood_newcomers_listed_frac"] = f"{frac:.2f}"
    finally:
        for dht in reversed(nodes):
            dht.shutdown()
    return fields


def declaration_flood(sybils: int = 1_100) -> dict[str, str]:
    outer_hash = "0123456789abcdef"
    seconds: list[float] = []
    together: list[bool] = []
    with gather_swarm(2) as pair:
        attacker = hivemind.DHT(
            start=True,
            initial_peers=[str(a) for a in dht_of(pair[0]).get_visible_maddrs()],
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        )
        try:
            for step in (1, 2, 3):
                for averager in pair:
                    averager.prepare_round(step, 0.0, outer_hash)
                if step == 1:
                    assert wait_until(lambda: all(len(a.peer_steps()) == 1 for a in pair), timeout_s=60)
                else:
                    flood_declarations(attacker, pair, step, outer_hash, count=sybils, seed=b"bench")
                grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in pair]
                started = time.monotonic()
                pending = [
                    a.start_average(g, step=step, outer_hash=outer_hash)
                    for a, g in zip(pair, grads, strict=True)
                ]
                outcomes = [p.result() for p in pending]
                seconds.append(time.monotonic() - started)
                together.append(averaged_together(outcomes))
        finally:
            attacker.shutdown()
    print(f"matchmaking-key flood: {sybils} sybil round declarations; rounds of {seconds[0]:.1f} s clean, "
          f"{seconds[1]:.1f} s flooded, {seconds[2]:.1f} s with the same sybils again; "
          f"averaged together: {together}")  # fmt: skip
    return {
        "declaration_flood_rounds_averaged": f"{sum(together[1:])}/2",
        "declaration_flood_round_ratio": f"{seconds[1] / seconds[0]:.2f}",
        "declaration_flood_next_round_ratio": f"{seconds[2] / seconds[0]:.2f}",
    }


def run_dht_floods(quick: bool) -> dict[str, str]:
    """Part 4's figures (see the module docstring)."""
    return {
        **memory_flood(20_000 if quick else 100_000),
        **subkey_flood([1100] if quick else [1100, 10_000]),
        **declaration_flood(),
    }
