"""The reducer's aggregation rules (`node.averaging.robust`): exact on honest inputs, bounded under attack."""

from __future__ import annotations

import pytest
import torch

from node.averaging.robust import aggregate, centered_clip, clip_radius, coordinate_median
from tests.helpers.attacks import ATTACKS, attack_inputs, honest_spread

N, DIM = 8, 2000


def _honest(n: int, seed: int = 0) -> torch.Tensor:
    """Pseudo-gradient-like rows: a shared direction plus per-trainer noise of the same size."""
    gen = torch.Generator().manual_seed(seed)
    signal = torch.randn(DIM, generator=gen)
    return signal + torch.randn(n, DIM, generator=gen)


def test_honest_inputs_give_the_mean() -> None:
    inputs = _honest(N)
    mean = inputs.double().mean(dim=0)
    result = centered_clip(inputs)
    assert result.dtype == torch.float32 and result.shape == (DIM,)
    assert torch.allclose(result.double(), mean, rtol=0, atol=1e-6)


def test_small_groups_and_constant_inputs_are_exact() -> None:
    assert torch.equal(centered_clip(torch.full((1, 5), 2.5)), torch.full((5,), 2.5))
    assert torch.equal(centered_clip(torch.tensor([[1.0] * 4, [3.0] * 4])), torch.full((4,), 2.0))
    assert torch.equal(centered_clip(torch.tensor([[1.0] * 4, [3.0] * 4, [5.0] * 4])), torch.full((4,), 3.0))
    # more than half agree: the others are clipped to nothing
    rows = torch.zeros(5, 3)
    rows[3:] = 100.0
    assert torch.equal(centered_clip(rows), torch.zeros(3))


def test_shapes_are_kept() -> None:
    inputs = _honest(4)[:, :60].reshape(4, 3, 20)
    assert centered_clip(inputs).shape == (3, 20)
    assert torch.allclose(centered_clip(inputs), inputs.mean(dim=0), atol=1e-6)


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("num_attackers", [1, 2, 3])
def test_attackers_move_the_result_at_most_f_tau_over_n_minus_f(attack: str, num_attackers: int) -> None:
    honest_count = N - num_attackers
    everyone = _honest(N, seed=num_attackers)
    honest, own = everyone[:honest_count], everyone[honest_count:]  # own: the attackers' honest ones
    attackers = attack_inputs(attack, honest, own, torch.Generator().manual_seed(7))
    inputs = torch.cat([honest, attackers])
    honest_mean = honest.mean(dim=0)
    tau = clip_radius(inputs.double(), coordinate_median(inputs.double()))
    bound = num_attackers * tau / honest_count
    robust_error = float((centered_clip(inputs) - honest_mean).norm())
    assert robust_error <= 1.01 * bound
    assert tau <= 1.5 * 1.5 * honest_spread(honest)  # the radius is the honest inputs', not the attackers'
    mean_error = float((inputs.mean(dim=0) - honest_mean).norm())
    if attack != "alie":  # ALIE hides inside the honest spread: it barely moves even the mean
        assert mean_error > 4 * robust_error


def test_sign_flip_does_not_turn_the_direction() -> None:
    everyone = _honest(N)
    honest = everyone[:6]
    attackers = attack_inputs("sign_flip", honest, everyone[6:])
    inputs = torch.cat([honest, attackers])
    honest_mean = honest.mean(dim=0)
    cosine = torch.nn.functional.cosine_similarity
    assert float(cosine(aggregate("mean", inputs), honest_mean, dim=0)) < 0
    assert float(cosine(aggregate("centered_clip", inputs), honest_mean, dim=0)) > 0.9


def test_rules_by_name() -> None:
    inputs = _honest(3)
    assert torch.equal(aggregate("mean", inputs), inputs.mean(dim=0))
    assert torch.equal(aggregate("centered_clip", inputs), centered_clip(inputs))
    with pytest.raises(ValueError, match="unknown aggregation rule"):
        aggregate("median", inputs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        centered_clip(torch.zeros(0, 3))
