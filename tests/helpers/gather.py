"""Loopback swarms of the averaging service's `GatherAverager`s, and one round run on all of them at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import hivemind
import torch

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from node.collective.round_types import RoundOutcome
from node.dht_node import start_loopback_dht
from node.swarm import wait_until
from protocol.dht_keys import averaging_round_key
from tests.helpers.dht_attacks import store_sybil_declarations

SHAPES = [torch.Size([64, 33]), torch.Size([7])]
PREFIX = "hivenet_diloco_gather_test"


@contextlib.contextmanager
def gather_swarm(
    n: int,
    codec: str = "int8",
    *,
    shapes: Sequence[torch.Size] = SHAPES,
    trust_each_other: bool = False,
    admit: Sequence[int] = (),
    **overrides: Any,
) -> Iterator[list[GatherAverager]]:
    """`n` averagers (named g0, g1, ...), each with its own DHT, on 127.0.0.1.

    With `trust_each_other`, every averager names all the others as the run's authorised
    publishers. `admit`: the indices of averagers that name each other as the run's only trainers
    (`admitted_trainers`); the others admit anyone. `overrides` are `AveragingConfig` fields.
    """
    first = start_loopback_dht()
    dhts = [first] + [start_loopback_dht([str(a) for a in first.get_visible_maddrs()]) for _ in range(n - 1)]
    settings = AveragingConfig(
        gather_timeout_s=20.0, commit_timeout_s=5.0, averaging_timeout_s=40.0, request_timeout_s=5.0
    ).model_copy(update=overrides)
    members = [dhts[j].peer_id for j in admit]
    averagers: list[GatherAverager] = []
    try:
        for i, dht in enumerate(dhts):
            averagers.append(
                GatherAverager(
                    shapes,
                    dht,
                    prefix=PREFIX,
                    codec=codec_for(codec, shapes, density=0.1, chunk_values=64),
                    config=settings,
                    trusted_state_sources=[d.peer_id for d in dhts if d is not dht]
                    if trust_each_other
                    else (),
                    admitted_trainers=members if i in admit else (),
                    name=f"g{i}",
                )
            )
        yield averagers
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


def run_round(
    averagers: list[GatherAverager], step: int, grads: list[list[torch.Tensor]], hashes: list[str]
) -> list[RoundOutcome]:
    for averager, digest in zip(averagers, hashes, strict=True):
        averager.prepare_round(step, 0.5, digest)
    # A trainer declares its round an outer step's inner steps ahead; here, wait until all see each
    # other at `step` (other trainers of the swarm may declare other steps).
    assert wait_until(
        lambda: all(sum(s == step for s in a.peer_steps().values()) == len(averagers) - 1 for a in averagers),
        timeout_s=60,
    )
    outcomes: list[RoundOutcome | None] = [None] * len(averagers)

    def one(i: int) -> None:
        outcomes[i] = averagers[i].start_average(grads[i], step=step, outer_hash=hashes[i]).result()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(averagers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def dht_of(averager: GatherAverager) -> hivemind.DHT:
    """The DHT `averager` runs on."""
    dht = averager.rounds.dht
    assert isinstance(dht, hivemind.DHT)
    return dht


def flood_declarations(
    attacker: hivemind.DHT,
    averagers: Sequence[GatherAverager],
    step: int,
    outer_hash: str,
    *,
    count: int,
    seed: bytes,
) -> None:
    """Store `count` valid round declarations for `step` by sybils with no host behind them (numbered
    from `seed`, so the same sybils can declare again) at every averager's DHT node, and wait until
    the averagers read them."""
    stored = attacker.run_coroutine(
        partial(
            store_sybil_declarations,
            targets=[dht_of(a).peer_id for a in averagers],
            key=averaging_round_key(PREFIX),
            count=count,
            seed=seed,
            step=step,
            outer_hash=outer_hash,
            codec=averagers[0].rounds.codec.name,
        ),
        return_future=True,
    ).result(timeout=300)
    assert stored >= count, f"the flood was refused ({stored} stores): it tests nothing"
    assert wait_until(
        lambda: all(sum(s == step for s in a.peer_steps().values()) >= min(count, 1000) for a in averagers),
        timeout_s=60,
    ), "the sybils' declarations are not what the averagers read"


def averaged_together(outcomes: Sequence[RoundOutcome]) -> bool:
    """Whether every member averaged with all the others into the same bits."""
    results = [o.averaged for o in outcomes]
    first = results[0]
    return (
        all(o.in_sync and o.num_peers == len(outcomes) for o in outcomes)
        and first is not None
        and all(
            r is not None and all(torch.equal(a, b) for a, b in zip(first, r, strict=True)) for r in results
        )
    )
