"""A reducer that returns every member the same wrong average is caught by the reducer audit.

Four averagers on loopback, one part per tensor (each member reduces one tensor in each pass);
peer3's reducer adds 0.5 to every average it computes, for everyone alike, so the next round's
hash check cannot see it. Without the audit the lie is applied by every member; with it, the
parts that peer3 reduced in either pass are disputed and left at zero, every other part is
exactly the honest robust aggregate, and the members stay bit-identical.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hivemind.proto import runtime_pb2

from node.averaging.averager import DiLoCoAverager
from node.averaging.robust import aggregate
from node.averaging.rounds import RoundOutcome
from node.averaging.runner import RobustAllReduceRunner
from tests.helpers.trainers import averager_swarm, round_test_settings, run_round

SHAPES = [torch.Size([250])] * 4
SHIFT = 0.5


class ConsistentLiarRunner(RobustAllReduceRunner):
    """Shifts every average it reduces, before encoding it once for all members (itself included)."""

    async def _encoded_average(
        self, part_index: int, averaged: torch.Tensor
    ) -> tuple[runtime_pb2.Tensor, torch.Tensor]:
        return await super()._encoded_average(part_index, averaged + SHIFT)


class ConsistentLiarAverager(DiLoCoAverager):
    runner_class = ConsistentLiarRunner


def _swarm(name: str, audit: bool) -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings(name, 4, audit_reducers=audit)
    classes = [DiLoCoAverager, DiLoCoAverager, DiLoCoAverager, ConsistentLiarAverager]
    with averager_swarm(SHAPES, classes, **kwargs) as averagers:
        yield averagers


@pytest.fixture(scope="module")
def honest_int8() -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings("auditedint8", 3, compression="int8")
    with averager_swarm(SHAPES, [DiLoCoAverager] * 3, **kwargs) as averagers:
        yield averagers


@pytest.fixture(scope="module")
def audited() -> Iterator[list[DiLoCoAverager]]:
    yield from _swarm("auditedliar", audit=True)


@pytest.fixture(scope="module")
def unaudited() -> Iterator[list[DiLoCoAverager]]:
    yield from _swarm("unauditedliar", audit=False)


def _grads(step: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(step)
    return [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(4)]


def _honest_aggregate(averagers: list[DiLoCoAverager], grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What an honest reducer returns for each tensor: the rule over the inputs in PeerID order."""
    order = sorted(range(len(averagers)), key=lambda i: averagers[i].peer_id.to_bytes())
    return [
        aggregate("centered_clip", torch.stack([grads[i][t] for i in order]).to(torch.float32))
        for t in range(len(SHAPES))
    ]


def _complete_round(averagers: list[DiLoCoAverager], first_step: int) -> tuple[list[RoundOutcome], int]:
    # A member a reducer left out (its request beat the reducer's group setup on a loaded machine)
    # reports the round incomplete: run another one.
    for step in range(first_step, first_step + 6, 2):
        outcomes = run_round(averagers, _grads(step), step=step)
        if all(o.in_sync and o.num_peers == 4 for o in outcomes):
            return outcomes, step
    raise AssertionError("no complete round in three tries")


def _results(outcomes: list[RoundOutcome]) -> list[list[torch.Tensor]]:
    results = [o.averaged for o in outcomes]
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def test_without_the_audit_every_member_applies_the_lie(unaudited: list[DiLoCoAverager]) -> None:
    outcomes, step = _complete_round(unaudited, 0)
    results = _results(outcomes)
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r, strict=True))
    honest = _honest_aggregate(unaudited, _grads(step))
    shifted = [t for t, h in zip(results[0], honest, strict=True) if torch.equal(t, h + SHIFT)]
    assert len(shifted) == 1, "the liar's tensor is applied, shifted, by everyone"
    assert all(o.disputed_parts == 0 for o in outcomes)


def test_the_audit_leaves_out_what_a_consistent_liar_reduced(audited: list[DiLoCoAverager]) -> None:
    outcomes, step = _complete_round(audited, 0)
    results = _results(outcomes)
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r, strict=True)), (
        "the members are no longer bit-identical"
    )
    honest = _honest_aggregate(audited, _grads(step))
    kept = [i for i, (t, h) in enumerate(zip(results[0], honest, strict=True)) if torch.equal(t, h)]
    zeroed = [i for i, t in enumerate(results[0]) if not t.any()]
    # the liar reduced one tensor in each pass, a different one each time: both are left out
    assert len(kept) == 2 and len(zeroed) == 2 and set(kept).isdisjoint(zeroed)
    assert all(o.disputed_parts == 2 for o in outcomes)
    assert all(a.disputed_parts() >= 2 for a in audited)  # counted (more if a round was retried)

    # The members still agree, so the next round's hash check keeps every one of them in sync.
    again, _ = _complete_round(audited, step + 1)
    assert all(o.in_sync for o in again)


def test_honest_reducers_agree_bit_for_bit_with_a_lossy_codec(honest_int8: list[DiLoCoAverager]) -> None:
    # Each reducer must reduce its own input as the others receive it (int8-encoded), or the two
    # passes of every part differ and the audit leaves out the whole round.
    for step in range(0, 6, 2):
        gen = torch.Generator().manual_seed(step)
        grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in honest_int8]
        outcomes = run_round(honest_int8, grads, step=step)
        if all(o.in_sync and o.num_peers == 3 for o in outcomes):
            break
    else:
        raise AssertionError("no complete round in three tries")
    results = _results(outcomes)
    assert all(o.disputed_parts == 0 for o in outcomes)
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r, strict=True))
    assert all(t.any() for t in results[0]), "no part was left out"
