"""An attacker inside the norm bound no longer turns a DiLoCo round's average around.

Four averagers on loopback: three honest ones with similar pseudo-gradients (a shared
direction plus their own noise) and one that sends minus nine times its own pseudo-gradient,
inside the reducers' 10x norm bound, so nothing is refused. With the default rule
(CenteredClip) the honest peers' identical result points the honest way; with the plain
mean it points the other way (the case the robust rule exists for).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import torch
from hivemind.averaging.allreduce import AveragingMode
from hivemind.compression import CompressionInfo
from hivemind.proto import averaging_pb2

from node.averaging.averager import DiLoCoAverager
from node.averaging.codecs import codec_for, decode_tensor
from node.averaging.robust import AggregationRule
from node.averaging.rounds import RoundOutcome
from node.averaging.runner import RobustAllReduceRunner
from tests.helpers.attacks import NORM_FACTOR
from tests.helpers.trainers import averager_swarm, round_test_settings, run_round

SHAPES = [torch.Size([600]), torch.Size([20, 20])]


class SignFlipRunner(RobustAllReduceRunner):
    """Sends minus NORM_FACTOR times its own parts."""

    async def _generate_input_for_peer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        codec = codec_for("fp32")
        async for message in super()._generate_input_for_peer(peer_index):
            part = -NORM_FACTOR * decode_tensor(message.tensor_part)
            message.tensor_part.CopyFrom(codec.compress(part, CompressionInfo.from_tensor(part)))
            yield message


class SignFlipAverager(DiLoCoAverager):
    runner_class = SignFlipRunner


def _pseudo_gradients() -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    signal = [torch.randn(s, generator=gen) for s in SHAPES]
    return [[x + 0.5 * torch.randn(x.shape, generator=gen) for x in signal] for _ in range(4)]


def _round(averagers: list[DiLoCoAverager], grads: list[list[torch.Tensor]]) -> list[RoundOutcome]:
    return run_round(averagers, grads, step=0)


@pytest.fixture(params=["centered_clip", "mean"])
def swarm(request: pytest.FixtureRequest) -> Iterator[tuple[AggregationRule, list[DiLoCoAverager]]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings(f"robusttest-{request.param}", 4, aggregation=request.param)
    classes = [DiLoCoAverager, DiLoCoAverager, DiLoCoAverager, SignFlipAverager]
    with averager_swarm(SHAPES, classes, **kwargs) as averagers:
        averagers[3].mode = AveragingMode.CLIENT  # it only sends: every part it sends is flipped
        yield request.param, averagers


def test_sign_flip_inside_the_norm_bound(swarm: tuple[AggregationRule, list[DiLoCoAverager]]) -> None:
    rule, averagers = swarm
    grads = _pseudo_gradients()
    outcomes = _round(averagers, grads)
    results = [o.averaged for o in outcomes[:3]]
    assert all(r is not None for r in results)
    flat = [torch.cat([t.reshape(-1) for t in r]) for r in results if r is not None]
    assert all(torch.equal(flat[0], f) for f in flat[1:]), "honest peers disagree"
    result = flat[0]
    assert all(o.refused_peers == 0 and o.num_peers == 4 for o in outcomes[:3]), (
        "the attack is inside the bound"
    )
    assert all(o.disputed_parts == 0 for o in outcomes[:3]), "honest reducers of one part agree"
    honest_mean = torch.stack([torch.cat([t.reshape(-1) for t in g]) for g in grads[:3]]).mean(dim=0)
    cosine = float(torch.nn.functional.cosine_similarity(result, honest_mean, dim=0))
    if rule == "centered_clip":
        assert cosine > 0.9
    else:  # what the robust rule prevents: the plain mean is turned around
        assert cosine < 0
