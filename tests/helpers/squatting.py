"""DHT squatting attacks on 127.0.0.1, shared by `tests/integration/swarm/test_squatting.py` and `bench/robustness.py`.

A squat is a plain hivemind client's `dht.store(key, b"squatted", expiration_time=now + 31 years)`
under a key the run depends on, in three variants: a plain value without a subkey (a regular value
with a later expiry would replace the key's whole dictionary), the same value under the subkey of
an honest peer (it would replace that peer's entry), and a plain value of 1 MiB. The attacker is a
plain `hivemind.DHT` without any record validator: it keeps the squats itself and serves them.

Each attack (`attack_*`) squats one key of a live run and then does the honest operation that the
squat used to break; its `SquatOutcome` counts the squats any honest node kept (in its storage or
cache) or returned from a lookup, and says whether the honest operation still worked. The swarm
(`SquatSwarm`, `tests.helpers.squat_swarm`) has two honest nodes with the production validator and DHT guard, a publisher and a
follower, each also hosting one averager; every attack brings a fresh attacker (the DHT guard bans
the sender of the 1 MiB value, which would make its next squats look refused for another reason).
`attack_with_large_values` is the "64 values of 1 MiB" attack on one node, with that node's RSS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psutil
import torch
from hivemind import DHT
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time
from hivemind.utils.serializer import MSGPackSerializer

from node.broadcast.broadcaster import WeightBroadcast
from node.membership import discover
from node.swarm import wait_until
from protocol.dht_keys import (
    averaging_round_key,
    node_records_key,
    signed_subkey,
    weights_holders_key,
    weights_pointer_key,
)
from protocol.errors import InvalidMessage
from protocol.limits import MAX_WEIGHTS_POINTER_TTL_S
from protocol.manifest import WEIGHTS_POINTER_DOMAIN, WeightsPointer
from tests.helpers.broadcast import (
    SwarmNode,
    assert_state_dicts_equal,
    make_state_dict,
    start_broadcast,
)
from tests.helpers.gather import run_round
from tests.helpers.members import validator_membership
from tests.helpers.squat_swarm import (
    AVERAGER_PREFIX,
    AVERAGER_SHAPES,
    LARGE_VALUE_BYTES,
    LARGE_VALUES,
    SQUAT_TTL_S,
    SquatOutcome,
    SquatSwarm,
    squat,
    squats_kept,
)

_STATE_FLOATS = 20_000


def _subkey_of(node: SwarmNode) -> str:
    return signed_subkey(node.identity.peer_id.to_base58())


# ---- the attacks -----------------------------------------------------------------------------


async def _pointers_under(broadcast: WeightBroadcast, key: str, run_id: str) -> list[int]:
    """Versions named by the signed pointers stored under `key` (a lookup from `broadcast`'s node)."""
    values = await broadcast.records.signed.get(
        key, domain=WEIGHTS_POINTER_DOMAIN, run_id=run_id, max_ttl_s=MAX_WEIGHTS_POINTER_TTL_S
    )
    versions = []
    for value in values:
        with contextlib.suppress(InvalidMessage):
            versions.append(WeightsPointer.from_payload(value.payload).version)
    return versions


def _same_state(left: dict[str, Any], right: dict[str, Any]) -> bool:
    try:
        assert_state_dicts_equal(left, right)
    except AssertionError:
        return False
    return True


@contextlib.asynccontextmanager
async def _broadcasts(swarm: SquatSwarm) -> AsyncIterator[tuple[WeightBroadcast, WeightBroadcast]]:
    """The publisher's and the follower's weight broadcasts (the publisher is the run's authority)."""
    directory = swarm.root / swarm.fresh_name("broadcast")
    publisher = await start_broadcast(swarm.publisher, directory / "publisher", [swarm.publisher])
    try:
        follower = await start_broadcast(swarm.follower, directory / "follower", [swarm.publisher])
        try:
            yield publisher, follower
        finally:
            await follower.stop()
    finally:
        await publisher.stop()


async def attack_weights_pointer(swarm: SquatSwarm) -> SquatOutcome:
    """Squat `weights/latest` after v1: the follower must still find v1, the publisher's v2 pointer
    must be stored under `latest`, and the follower must fetch v2 intact."""
    run_id = swarm.fresh_name("pointer")
    key = weights_pointer_key(run_id)
    async with _broadcasts(swarm) as (publisher, follower):
        await publisher.publish(run_id, 1, make_state_dict(seed=1, total_floats=_STATE_FLOATS))
        with swarm.attacker() as attacker:
            await squat(attacker, key, _subkey_of(swarm.publisher))
            kept = await squats_kept(swarm.honest, key)
            found = await follower.records.find_pointer(run_id)
            state = make_state_dict(seed=2, total_floats=_STATE_FLOATS)
            await publisher.publish(run_id, 2, state)
            latest = await _pointers_under(follower, key, run_id)
            entry = await asyncio.wait_for(follower.fetch(run_id, manifest_timeout_s=10.0), timeout=60)
            fetched = await follower.load(run_id, entry.version)
    found_version = found.version if found is not None else None
    intact = _same_state(fetched, state)
    return SquatOutcome(
        "weights pointer",
        kept,
        found_version == 1 and 2 in latest and entry.version == 2 and intact,
        f"found v{found_version} after the squat; `latest` then named {latest}; "
        f"fetched v{entry.version} {'intact' if intact else 'corrupted'}",
    )


async def attack_weights_holders(swarm: SquatSwarm) -> SquatOutcome:
    """Squat `weights/1/holders`: the follower must still see the publisher as a holder and fetch v1."""
    run_id = swarm.fresh_name("holders")
    key = weights_holders_key(run_id, 1)
    async with _broadcasts(swarm) as (publisher, follower):
        state = make_state_dict(seed=3, total_floats=_STATE_FLOATS)
        manifest = await publisher.publish(run_id, 1, state)
        with swarm.attacker() as attacker:
            await squat(attacker, key, _subkey_of(swarm.publisher))
            kept = await squats_kept(swarm.honest, key)
            holders = await follower.records.find_holders(run_id, 1, manifest.content_id)
            entry = await asyncio.wait_for(follower.fetch(run_id, 1, manifest_timeout_s=10.0), timeout=60)
            fetched = await follower.load(run_id, entry.version)
    seen = [h.peer_id for h in holders]
    intact = _same_state(fetched, state)
    return SquatOutcome(
        "weights holders",
        kept,
        swarm.publisher.identity.peer_id in seen and intact,
        f"{len(seen)} holder(s) seen after the squat; fetched v{entry.version} "
        f"{'intact' if intact else 'corrupted'}",
    )


async def _record_seqs(dht: DHT, run_id: str) -> dict[bytes, int]:
    """The sequence number of each live node record of `run_id` that `dht` discovers."""
    return {node.record.peer_id: node.seq for node in await discover(dht, run_id)}


async def attack_node_records(swarm: SquatSwarm) -> SquatOutcome:
    """Squat the run's `nodes` key: discovery must still find both nodes from either side, and both
    nodes' next records must land (seen with a newer sequence number).

    The next records are checked by a lookup, not by `Membership.publish`'s result: hivemind reports
    the answer of whichever replica answered last, and the attacker's own node refuses them.
    """
    run_id = swarm.fresh_name("nodes")
    key = node_records_key(run_id)
    nodes = (swarm.publisher, swarm.follower)
    members = [validator_membership(node.dht, node.identity, run_id) for node in nodes]
    for member in members:
        await member.publish()
    with swarm.attacker() as attacker:
        await squat(attacker, key, _subkey_of(swarm.publisher))
        kept = await squats_kept(swarm.honest, key)
        before = [await _record_seqs(node.dht, run_id) for node in nodes]
        for member in members:
            await member.publish()
        after = [await _record_seqs(node.dht, run_id) for node in reversed(nodes)]
    seen = [len(seqs) for seqs in before]
    landed = [
        all(seqs.get(peer, 0) > seq for peer, seq in old.items())
        for old, seqs in zip(before, after, strict=True)
    ]
    return SquatOutcome(
        "node records",
        kept,
        seen == [2, 2] and all(landed),
        f"discovery found {seen} node(s) after the squat; the next records landed: {landed}",
    )


SAME_HASH = "0123456789abcdef"
"""Both averagers' outer state hash (they hold the same state)."""


def _one_round(swarm: SquatSwarm, step: int) -> list[int]:
    """Both honest averagers average outer step `step` together; the group sizes they report."""
    averagers = swarm.start_averagers()
    grads = [[torch.full(s, float(i + 1)) for s in AVERAGER_SHAPES] for i in range(len(averagers))]
    outcomes = run_round(averagers, step, grads, [SAME_HASH] * len(averagers))
    return [o.num_peers for o in outcomes]


def attack_round_declarations(swarm: SquatSwarm, step: int = 3) -> SquatOutcome:
    """Squat the key where the run's trainers declare their rounds: both averagers must still see
    each other and average outer step `step` together."""
    averagers = swarm.start_averagers()
    key = averaging_round_key(AVERAGER_PREFIX)
    with swarm.attacker() as attacker:
        asyncio.run(squat(attacker, key, signed_subkey(averagers[0].p2p.peer_id.to_base58())))
        kept = asyncio.run(squats_kept(swarm.honest, key))
        peers = _one_round(swarm, step)
    return SquatOutcome(
        "round declarations", kept, peers == [2, 2], f"outer step {step} averaged in groups of {peers}"
    )


FORGED_STEP = 10**6


async def forged_entries(honest: Sequence[DHT], key: str, victim: str) -> int:
    """Forged values (`FORGED_STEP`) under `key` in the victim's subkey that an honest lookup returns
    (the victim's own signed declaration may be there too, and is not counted)."""
    kept = 0
    for dht in honest:
        found = await dht.get(key, latest=True, return_future=True)
        if found is not None and isinstance(found.value, dict):
            entry = found.value.get(victim)
            kept += entry is not None and entry.value == float(FORGED_STEP)
    return kept


def attack_forged_declarations(swarm: SquatSwarm, step: int = 5) -> SquatOutcome:
    """Write, in an honest averager's name and without its signature, a declaration of a step it never
    reached, expiring long after its own. The other averager must see the victim's real step, and
    the two must still average together at `step`."""
    averagers = swarm.start_averagers()
    victim_subkey = signed_subkey(averagers[0].p2p.peer_id.to_base58())
    key = averaging_round_key(AVERAGER_PREFIX)
    with swarm.attacker() as attacker:
        attacker.store(key, float(FORGED_STEP), get_dht_time() + 3000, subkey=victim_subkey)
        kept = asyncio.run(forged_entries(swarm.honest, key, victim_subkey))
        averagers[0].prepare_round(step, 0.5, SAME_HASH)
        seen = wait_until(lambda: list(averagers[1].peer_steps().values()) == [step], timeout_s=30)
        peers = _one_round(swarm, step)
    return SquatOutcome(
        "forged declarations",
        kept,
        seen and peers == [2, 2],
        f"victim's real step {step} seen: {seen}; outer step {step} averaged in groups of {peers}",
    )


SQUAT_ATTACKS: dict[str, Callable[[SquatSwarm], SquatOutcome]] = {
    "weights pointer": lambda swarm: asyncio.run(attack_weights_pointer(swarm)),
    "weights holders": lambda swarm: asyncio.run(attack_weights_holders(swarm)),
    "node records": lambda swarm: asyncio.run(attack_node_records(swarm)),
    "round declarations": attack_round_declarations,
    "forged declarations": attack_forged_declarations,
}
"""Every squatting attack by name, run from synchronous code."""


def run_squat_attack(swarm: SquatSwarm, attack: str) -> SquatOutcome:
    """Run one of `SQUAT_ATTACKS` on `swarm`."""
    return SQUAT_ATTACKS[attack](swarm)


# ---- 64 values of 1 MiB ----------------------------------------------------------------------


async def _store_large_values(_dht: Any, node: Any, target: Any, count: int, size: int) -> int:
    """Send `count` store requests of one `size`-byte plain value each to `target`; how many it accepted."""
    accepted = 0
    for index in range(count):
        value = index.to_bytes(4, "big") + bytes(size - 4)
        result = await node.protocol.call_store(
            target,
            [DHTID.generate(source=f"large-value-{index}")],
            [MSGPackSerializer.dumps(value)],
            [get_dht_time() + SQUAT_TTL_S],
        )
        accepted += bool(result) and all(result)
    return accepted


@dataclass
class LargeValuesOutcome:
    """What storing LARGE_VALUES values of LARGE_VALUE_BYTES at one honest node did to it."""

    accepted: int
    rss_before: int
    rss_after: int

    @property
    def growth(self) -> int:
        return self.rss_after - self.rss_before


def attack_with_large_values(swarm: SquatSwarm) -> LargeValuesOutcome:
    """Store 64 values of 1 MiB at the follower's DHT node; its DHT process's RSS before and after."""
    target = swarm.follower.dht
    process = psutil.Process(target.pid)
    with swarm.attacker() as attacker:
        before = process.memory_info().rss
        store = partial(
            _store_large_values, target=target.peer_id, count=LARGE_VALUES, size=LARGE_VALUE_BYTES
        )
        accepted = attacker.run_coroutine(store)
        after = process.memory_info().rss
    return LargeValuesOutcome(accepted, before, after)
