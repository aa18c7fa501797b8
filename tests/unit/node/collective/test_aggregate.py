"""The round's aggregation (`node.collective.aggregate.aggregate_contributions`): the same bits on
every member whatever its thread count or the inputs' memory layout, the mean and CenteredClip as
`node.collective.rules` defines them, and the norm cap.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import pytest
import torch

from node.collective.aggregate import aggregate_contributions
from node.collective.rules import AggregationRule
from tests.helpers.robust_reference import centered_clip, clip_radius, coordinate_median

SHAPES: list[tuple[int, ...]] = [(3, 40), (257,), (), (2, 1, 5)]


def _honest(n: int, seed: int = 0, shapes: Sequence[tuple[int, ...]] = SHAPES) -> list[list[torch.Tensor]]:
    """Pseudo-gradient-like contributions: a shared direction plus per-trainer noise of the same size."""
    gen = torch.Generator().manual_seed(seed)
    signal = [torch.randn(shape, generator=gen) for shape in shapes]
    return [[s + torch.randn(s.shape, generator=gen) for s in signal] for _ in range(n)]


def _rows(contributions: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """The contributions as float64 rows (n, total values)."""
    return torch.stack([torch.cat([t.reshape(-1) for t in c]).double() for c in contributions])


def _cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]).double()


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("rule", ["centered_clip", "mean"])
def test_the_result_is_the_same_bits_whatever_the_thread_count(rule: AggregationRule) -> None:
    contributions = _honest(5, shapes=[(64, 512), (7,)])
    contributions[3] = [100.0 * t for t in contributions[3]]  # something for the clip to clip
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = aggregate_contributions(contributions, rule=rule)
        torch.set_num_threads(2)
        two = aggregate_contributions(contributions, rule=rule)
    finally:
        torch.set_num_threads(before)
    assert _same(one.tensors, two.tensors)


@pytest.mark.parametrize("rule", ["centered_clip", "mean"])
def test_the_result_is_the_same_bits_whatever_the_memory_layout(rule: AggregationRule) -> None:
    contributions = _honest(5)
    contributions[0] = [10.0 * t for t in contributions[0]]
    transposed = [[t.T.contiguous().T if t.dim() == 2 else t for t in c] for c in contributions]
    assert not transposed[0][0].is_contiguous()
    assert all(_same(a, b) for a, b in zip(contributions, transposed, strict=True))  # the same values
    plain = aggregate_contributions(contributions, rule=rule)
    other = aggregate_contributions(transposed, rule=rule)
    assert _same(plain.tensors, other.tensors)


def test_mean_is_the_float64_mean_cast_to_float32() -> None:
    gen = torch.Generator().manual_seed(3)
    n = 5
    # values on a grid of 2**-16 within +-16: their float64 sums are exact in any order, so the
    # reference below is the exactly rounded float64 mean
    contributions = [
        [torch.randint(-(2**20), 2**20, shape, generator=gen).float() / 2**16 for shape in SHAPES]
        for _ in range(n)
    ]
    result = aggregate_contributions(contributions, rule="mean")
    assert result.refused == []
    for i, shape in enumerate(SHAPES):
        stacked = torch.stack([c[i] for c in contributions]).double()
        expected = (stacked.sum(dim=0) / n).float()
        assert result.tensors[i].dtype == torch.float32 and result.tensors[i].shape == shape
        assert torch.equal(result.tensors[i], expected)


def test_mean_of_arbitrary_floats_is_the_correctly_rounded_float64_mean() -> None:
    contributions = _honest(7, seed=4, shapes=[(300,)])
    result = aggregate_contributions(contributions, rule="mean").tensors[0]
    rows = _rows(contributions)
    expected = torch.tensor([math.fsum(rows[:, j].tolist()) / 7 for j in range(rows.shape[1])]).float()
    assert torch.equal(result, expected)


def test_centered_clip_of_honest_inputs_is_the_mean_and_robust_centered_clip() -> None:
    contributions = _honest(6, seed=1)
    result = aggregate_contributions(contributions, rule="centered_clip")
    assert result.refused == []
    got = _cat(result.tensors)
    mean = _rows(contributions).mean(dim=0)
    assert torch.allclose(got, mean, rtol=1e-6, atol=1e-6)
    reference = centered_clip(_rows(contributions).float()).double()
    assert float((got - reference).norm()) <= 1e-6 * float(reference.norm())


def test_centered_clip_matches_robust_centered_clip_under_attack() -> None:
    contributions = _honest(5, seed=2)
    contributions[2] = [t * -50.0 for t in contributions[2]]
    got = _cat(aggregate_contributions(contributions, rule="centered_clip").tensors)
    reference = centered_clip(_rows(contributions).float()).double()
    assert float((got - reference).norm()) <= 1e-6 * float(reference.norm())


def test_one_attacker_among_five_moves_centered_clip_by_at_most_tau_over_n_minus_one() -> None:
    n = 5
    honest = _honest(n - 1, seed=5)
    attacker = [torch.full(t.shape, 1e6) for t in honest[0]]
    contributions = [*honest[:2], attacker, *honest[2:]]
    inputs = _rows(contributions)
    honest_mean = _rows(honest).mean(dim=0)
    tau = clip_radius(inputs, coordinate_median(inputs))
    bound = tau / (n - 1)  # f * tau / (n - f), f = 1 (node.collective.rules)
    robust = _cat(aggregate_contributions(contributions, rule="centered_clip").tensors)
    mean = _cat(aggregate_contributions(contributions, rule="mean").tensors)
    assert float((robust - honest_mean).norm()) <= 1.01 * bound
    assert float((mean - honest_mean).norm()) > 1000 * bound  # while the mean is dragged far


def _scaled(contributions: list[list[torch.Tensor]], factors: dict[int, float]) -> list[list[torch.Tensor]]:
    return [[t * factors.get(i, 1.0) for t in c] for i, c in enumerate(contributions)]


@pytest.mark.parametrize("rule", ["centered_clip", "mean"])
def test_the_norm_cap_refuses_exactly_the_outliers(rule: AggregationRule) -> None:
    base = _honest(7, seed=6)
    norms = _rows(base).norm(dim=1)
    assert float(norms.max() / norms.min()) < 1.2  # honest norms are alike
    contributions = _scaled(base, {1: 10.0, 2: 2.5, 5: 40.0})  # 2.5x stays within a ratio of 3
    result = aggregate_contributions(contributions, rule=rule, max_norm_ratio=3.0)
    assert result.refused == [1, 5]
    kept = [c for i, c in enumerate(contributions) if i not in (1, 5)]
    assert _same(result.tensors, aggregate_contributions(kept, rule=rule).tensors)
    # without a cap, nobody is refused
    assert aggregate_contributions(contributions, rule=rule).refused == []


def test_the_norm_cap_refuses_nobody_among_honest_inputs() -> None:
    contributions = _honest(5, seed=7)
    result = aggregate_contributions(contributions, rule="mean", max_norm_ratio=1.5)
    assert result.refused == []
    assert _same(result.tensors, aggregate_contributions(contributions, rule="mean").tensors)


@pytest.mark.parametrize("n", [1, 2])
def test_the_norm_cap_does_nothing_with_fewer_than_three_inputs(n: int) -> None:
    contributions = _scaled(_honest(n, seed=8), {n - 1: 1000.0})
    capped = aggregate_contributions(contributions, rule="mean", max_norm_ratio=1.5)
    assert capped.refused == []
    assert _same(capped.tensors, aggregate_contributions(contributions, rule="mean").tensors)


@pytest.mark.parametrize("rule", ["centered_clip", "mean"])
def test_output_shapes_and_dtype_match_the_inputs(rule: AggregationRule) -> None:
    contributions = _honest(4, seed=9)
    result = aggregate_contributions(contributions, rule=rule)
    assert [t.shape for t in result.tensors] == [torch.Size(s) for s in SHAPES]
    assert all(t.dtype == torch.float32 for t in result.tensors)
    # the 0-d tensor is aggregated like the others (here: each value is the mean of its column)
    expected = torch.stack([c[2] for c in contributions]).double().mean().float()
    assert torch.allclose(result.tensors[2], expected, rtol=1e-6, atol=1e-6)


def test_a_single_contribution_is_returned_as_is() -> None:
    contributions = _honest(1, seed=10)
    rules: tuple[AggregationRule, ...] = ("centered_clip", "mean")
    for rule in rules:
        result = aggregate_contributions(contributions, rule=rule)
        assert _same(result.tensors, contributions[0])


def test_no_contribution_or_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError):
        aggregate_contributions([], rule="mean")
    with pytest.raises(ValueError):
        aggregate_contributions(_honest(2), rule="median")  # type: ignore[arg-type]


def test_a_norm_floor_keeps_ordinary_contributions_where_most_members_sent_zeros() -> None:
    """RL trainers whose groups all had equal rewards send zero pseudo-gradients: with the median
    norm alone as the cap's base, the cap would be zero and refuse every ordinary contribution."""
    ordinary = _honest(1, seed=7)[0]
    zeros = [torch.zeros_like(t) for t in ordinary]
    contributions = [zeros, ordinary, zeros]
    assert aggregate_contributions(contributions, rule="mean", max_norm_ratio=10.0).refused == [1]
    floor = float(_cat(ordinary).norm())  # the floor, e.g. `min_norm_per_value` * sqrt(values)
    kept = aggregate_contributions(contributions, rule="mean", max_norm_ratio=10.0, min_norm=floor)
    assert kept.refused == []
    assert torch.allclose(_cat(kept.tensors), _cat(ordinary) / 3, atol=1e-6)
    huge = [t * 1e4 for t in ordinary]
    assert aggregate_contributions(
        [zeros, huge, zeros], rule="mean", max_norm_ratio=10.0, min_norm=floor
    ).refused == [1]


def test_a_contribution_at_the_centre_raises_no_floating_point_warning() -> None:
    """A row exactly at the coordinate-wise median has distance 0; dividing by it overflowed (a
    RuntimeWarning, an error under `-W error`) although that branch is never taken."""
    contributions = [[torch.full((4,), v)] for v in (0.0, 10.0, 20.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = aggregate_contributions(contributions, rule="centered_clip").tensors
    assert torch.equal(got[0], torch.full((4,), 10.0))
