"""A misbehaving member of an averaging-service round gets at most its fair share of the aggregate.

In the gather design (`node.collective`) every member aggregates every contribution itself, so an
attacker is a member whose contribution is manipulated: the tests pass it attacked tensors (or,
for NaN, which an honest encoder refuses to send, a payload with a NaN block scale). The honest
members must end bit-identical, with the run's norm cap (10x the median norm, as a trainer's
default `max_norm_ratio`) and rule (`node.collective.rules`) applied to what was sent:

* three members, honest pseudo-gradients of all 1s and all 3s, an attacker with all 5s (its fair
  third), 5e6s (refused by the norm cap) or NaN (undecodable, refused); a member with a small
  pseudo-gradient does not get the others refused;
* four members, three honest (a shared direction plus noise) and one running each attack of
  `tests.helpers.attacks` inside the norm cap: with CenteredClip the result stays within
  `f * tau / (n - f)` of the honest mean (a sign flip does not turn it around); with the plain
  mean it is dragged far beyond that (the case the robust rule exists for).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.round_types import RoundOutcome
from node.collective.rules import AggregationRule
from tests.helpers.attacks import ATTACKS, attack_inputs
from tests.helpers.gather import gather_swarm, run_round
from tests.helpers.robust_reference import centered_clip, clip_radius, coordinate_median

HASH = "00" * 8
NORM_CAP = 10.0
TRIO_SHAPES = [torch.Size([1000]), torch.Size([10, 10])]
QUARTET_SHAPES = [torch.Size([600]), torch.Size([20, 20])]
_INT8_HEADER_BYTES = 4  # b"HV", codec id, version; then the blocks' float32 scales


@pytest.fixture(scope="module")
def trio(one_torch_thread: None) -> Iterator[tuple[list[GatherAverager], Iterator[int]]]:
    # bans expire at once, so each scenario starts clean (the NaN sender is banned)
    with gather_swarm(3, shapes=TRIO_SHAPES, max_norm_ratio=NORM_CAP, ban_base_s=0.01) as averagers:
        yield averagers, itertools.count()


@pytest.fixture(scope="module", params=["centered_clip", "mean"])
def quartet(
    request: pytest.FixtureRequest, one_torch_thread: None
) -> Iterator[tuple[AggregationRule, list[GatherAverager], Iterator[int]]]:
    rule: AggregationRule = request.param
    with gather_swarm(4, shapes=QUARTET_SHAPES, max_norm_ratio=NORM_CAP, aggregation=rule) as averagers:
        yield rule, averagers, itertools.count()


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _split(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    return [
        part.reshape(s).clone()
        for part, s in zip(flat.split([s.numel() for s in shapes]), shapes, strict=True)
    ]


def _sent(grads: Sequence[Sequence[torch.Tensor]], shapes: Sequence[torch.Size]) -> torch.Tensor:
    """What the members receive of `grads` (the swarm's int8 codec is stateless), one row each, float32."""
    codec = codec_for("int8", shapes)
    return torch.stack([_flat(codec.decode(codec.encode(list(g)))) for g in grads])


def _honest_result(outcomes: Sequence[RoundOutcome]) -> list[torch.Tensor]:
    first = outcomes[0].averaged
    assert first is not None
    for outcome in outcomes[1:]:
        assert outcome.averaged is not None
        assert all(torch.equal(x, y) for x, y in zip(first, outcome.averaged, strict=True)), (
            "honest peers disagree"
        )
    return first


def _nan_scale(
    encode: Callable[[Sequence[torch.Tensor]], bytes],
) -> Callable[[Sequence[torch.Tensor]], bytes]:
    def encode_with_nan(tensors: Sequence[torch.Tensor]) -> bytes:
        payload = bytearray(encode(tensors))
        payload[_INT8_HEADER_BYTES : _INT8_HEADER_BYTES + 4] = struct.pack("<f", math.nan)
        return bytes(payload)

    return encode_with_nan


def _trio_round(averagers: list[GatherAverager], step: int, values: Sequence[float]) -> list[RoundOutcome]:
    grads = [[torch.full(s, v) for s in TRIO_SHAPES] for v in values]
    return run_round(averagers, step, grads, [HASH] * len(averagers))


@pytest.mark.parametrize(
    ("attack", "expected", "refused"),
    [("none", 3.0, 0), ("huge", 2.0, 1), ("nan", 2.0, 1)],
    ids=["honest", "huge-pseudo-gradient", "nan-pseudo-gradient"],
)
def test_attacker_gets_at_most_its_fair_share(
    trio: tuple[list[GatherAverager], Iterator[int]],
    monkeypatch: pytest.MonkeyPatch,
    attack: str,
    expected: float,
    refused: int,
) -> None:
    averagers, steps = trio
    attacker = averagers[2]
    if attack == "nan":  # an honest encoder refuses NaN; this attacker's sends it in a block scale
        monkeypatch.setattr(attacker.rounds.codec, "encode", _nan_scale(attacker.rounds.codec.encode))
    outcomes = _trio_round(averagers, next(steps), (1.0, 3.0, 5e6 if attack == "huge" else 5.0))
    for tensor in _honest_result(outcomes[:2]):
        assert torch.equal(tensor, torch.full_like(tensor, expected))
    for outcome in outcomes[:2]:
        assert outcome.in_sync
        assert outcome.refused_peers == refused and outcome.num_peers == 3 - refused, outcome
        # a refused contribution earns no training receipt
        assert (attacker.rounds.me in outcome.received_bytes) == (refused == 0)


def test_a_member_with_a_small_pseudo_gradient_does_not_get_honest_ones_refused(
    trio: tuple[list[GatherAverager], Iterator[int]],
) -> None:
    """Regression (from the all-reduce averager, whose reducer held every part to 10x its *own* norm):
    a member that resynced late in a round (few inner steps, a small pseudo-gradient) must not
    refuse the others. Here the cap is the round's median norm, the same for every member."""
    averagers, steps = trio
    values = (0.01, 3.0, 5.0)
    outcomes = _trio_round(averagers, next(steps), values)
    mean = float(
        _sent([[torch.full(s, v) for s in TRIO_SHAPES] for v in values], TRIO_SHAPES).double().mean()
    )
    for tensor in _honest_result(outcomes):  # all three are honest here, the small one included
        assert torch.allclose(tensor, torch.full_like(tensor, mean))
    for outcome in outcomes:
        assert outcome.refused_peers == 0 and outcome.num_peers == 3, outcome


def _quartet_grads() -> list[list[torch.Tensor]]:
    """Four honest pseudo-gradients: a shared direction plus each trainer's own noise."""
    gen = torch.Generator().manual_seed(0)
    signal = [torch.randn(s, generator=gen) for s in QUARTET_SHAPES]
    return [[x + 0.5 * torch.randn(x.shape, generator=gen) for x in signal] for _ in range(4)]


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attacker_inside_the_norm_cap_moves_the_aggregate_at_most_its_bound(
    quartet: tuple[AggregationRule, list[GatherAverager], Iterator[int]], attack: str
) -> None:
    rule, averagers, steps = quartet
    grads = _quartet_grads()
    rows = torch.stack([_flat(g) for g in grads])
    # the last member attacks: the omniscient attacker knows the honest rows, and has its own
    forged = attack_inputs(attack, rows[:3], rows[3:], torch.Generator().manual_seed(7))
    grads[3] = _split(forged[0], QUARTET_SHAPES)
    outcomes = run_round(averagers, next(steps), grads, [HASH] * 4)
    result = _flat(_honest_result(outcomes[:3])).double()
    for outcome in outcomes[:3]:
        assert outcome.in_sync
        assert outcome.refused_peers == 0 and outcome.num_peers == 4, f"{attack} is inside the cap: {outcome}"

    sent = _sent(grads, QUARTET_SHAPES)
    honest_mean = sent[:3].double().mean(dim=0)
    tau = clip_radius(sent.double(), coordinate_median(sent.double()))
    bound = 1 * tau / (4 - 1)  # f * tau / (n - f), f = 1 attacker among n = 4
    error = float((result - honest_mean).norm())
    cosine = float(torch.nn.functional.cosine_similarity(result, honest_mean, dim=0))
    if rule == "centered_clip":
        torch.testing.assert_close(result.float(), centered_clip(sent))
        assert error <= 1.01 * bound, (error, bound)
        if attack == "sign_flip":
            assert cosine > 0.9
    else:  # what the robust rule prevents: the plain mean goes where the attacker drags it
        torch.testing.assert_close(result.float(), sent.double().mean(dim=0).float())
        if attack != "alie":  # ALIE hides inside the honest spread: it barely moves even the mean
            assert error > 4 * bound, (error, bound)
        if attack == "sign_flip":
            assert cosine < 0
