"""A misbehaving trainer cannot take more than its fair share of a DiLoCo round.

Three averagers on loopback: two honest ones with pseudo-gradients of all 1s and all 3s,
and an attacker that (a) claims a weight of 1e9, (b) sends a huge pseudo-gradient, or
(c) sends NaN. The honest peers must end with identical results: the equal-weight mean of
all three in (a), and the mean of the honest two in (b) and (c), where the attacker's part
is refused and counted as refused.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
from collections.abc import AsyncIterator, Iterator

import pytest
import torch
from hivemind.averaging.allreduce import AveragingMode
from hivemind.compression import CompressionInfo
from hivemind.proto import averaging_pb2

from node.averaging.averager import DiLoCoAverager
from node.averaging.codecs import codec_for, decode_tensor
from node.averaging.rounds import RoundOutcome
from node.averaging.runner import RobustAllReduceRunner
from tests.helpers.trainers import averager_swarm, round_test_settings, run_round

SHAPES = [torch.Size([1000]), torch.Size([10, 10])]
ATTACK = mp.Value(ctypes.c_int, 0)  # shared with the attacker's (forked) averager process
NONE, WEIGHT, HUGE, NAN = 0, 1, 2, 3


class AttackRunner(RobustAllReduceRunner):
    """Sends 5s with a claimed weight of 1e9, or 5e6s, or NaNs, depending on ATTACK."""

    async def _generate_input_for_peer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        codec = codec_for("fp32")
        async for message in super()._generate_input_for_peer(peer_index):
            part = decode_tensor(message.tensor_part)
            mode = ATTACK.value
            if mode == WEIGHT:
                message.weight = 1e9
            elif mode == HUGE:
                part = part * 1e6
            elif mode == NAN:
                part = torch.full_like(part, float("nan"))
            message.tensor_part.CopyFrom(codec.compress(part, CompressionInfo.from_tensor(part)))
            yield message


class AttackAverager(DiLoCoAverager):
    runner_class = AttackRunner


@pytest.fixture(scope="module")
def swarm() -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    # bans expire at once so each scenario starts clean
    kwargs = round_test_settings("advtest", 3, ban_base_s=0.01)
    with averager_swarm(SHAPES, [DiLoCoAverager, DiLoCoAverager, AttackAverager], **kwargs) as averagers:
        averagers[2].mode = AveragingMode.CLIENT  # the attacker only sends; honest peers reduce everything
        yield averagers


def _round(
    averagers: list[DiLoCoAverager], step: int, values: tuple[float, float, float] = (1.0, 3.0, 5.0)
) -> list[RoundOutcome]:
    return run_round(averagers, [[torch.full(s, v) for s in SHAPES] for v in values], step=step)


def _honest_result(outcomes: list[RoundOutcome]) -> list[torch.Tensor]:
    first, second = outcomes[0].averaged, outcomes[1].averaged
    assert first is not None and second is not None
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True)), "honest peers disagree"
    return first


@pytest.mark.parametrize(
    ("attack", "expected", "refused"),
    [(NONE, 3.0, 0), (WEIGHT, 3.0, 0), (HUGE, 2.0, 1), (NAN, 2.0, 1)],
    ids=["honest", "claims-huge-weight", "huge-pseudo-gradient", "nan-pseudo-gradient"],
)
def test_attacker_gets_at_most_its_fair_share(
    swarm: list[DiLoCoAverager], attack: int, expected: float, refused: int
) -> None:
    ATTACK.value = attack
    outcomes = _round(swarm, step=attack)
    result = _honest_result(outcomes)
    for tensor in result:
        assert torch.equal(tensor, torch.full_like(tensor, expected))
    assert outcomes[0].refused_peers == refused and outcomes[1].refused_peers == refused
    assert outcomes[0].num_peers == 3 - refused


def test_a_peer_with_a_small_pseudo_gradient_does_not_refuse_honest_ones(swarm: list[DiLoCoAverager]) -> None:
    """Regression: a reducer held every part to 10x its *own* norm, so a peer that resynced late in a
    round (few inner steps, a small pseudo-gradient) refused and banned the honest peers."""
    ATTACK.value = NONE
    _round(swarm, step=10)  # a normal round: the group's average (3 per value) becomes the reference
    outcomes = _round(swarm, step=11, values=(0.01, 3.0, 5.0))
    result = _honest_result(outcomes)
    for tensor in result:
        assert torch.allclose(tensor, torch.full_like(tensor, (0.01 + 3.0 + 5.0) / 3))
    assert outcomes[0].refused_peers == 0 and outcomes[1].refused_peers == 0
    assert outcomes[0].num_peers == 3
