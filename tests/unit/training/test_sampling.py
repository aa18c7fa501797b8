"""Tests for training.sampling: deterministic seeded noise, exact Gumbel-max sampling, nucleus."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.sampling import SamplingParams, gumbel_noise, mass_before, sample_tokens, seeded_scores

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_noise_is_a_pure_function_of_seed_and_position():
    a = gumbel_noise(42, [0, 1, 2], 256)
    assert a.shape == (3, 256) and a.dtype == np.float64
    assert np.array_equal(a, gumbel_noise(42, [0, 1, 2], 256))
    # A row depends on its own position only, not on which other rows are computed.
    assert np.array_equal(a[2], gumbel_noise(42, [2], 256)[0])
    assert not np.array_equal(a, gumbel_noise(43, [0, 1, 2], 256))
    assert not np.array_equal(a[0], a[1])


def test_noise_values_are_pinned():
    # Platform-independent: splitmix64 in wrapping uint64 arithmetic, then -log(-log(u)).
    got = gumbel_noise(123, [5], 4)[0]
    again = gumbel_noise(123, [5], 4)[0]
    assert np.array_equal(got, again)
    np.testing.assert_allclose(got, _reference_noise(123, 5, 4), rtol=0, atol=0)


def _reference_noise(seed: int, pos: int, vocab: int) -> list[float]:
    """The same construction with Python integers (independent of numpy's uint64 handling)."""
    mask = 2**64 - 1

    def mix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    row = mix(mix(seed) ^ mix(pos))
    out = []
    for j in range(vocab):
        bits = mix((row + j * 0x9E3779B97F4A7C15) & mask)
        u = ((bits >> 11) + 0.5) * 2.0**-53
        out.append(-math.log(-math.log(u)))
    return out


def test_noise_is_standard_gumbel():
    g = gumbel_noise(7, np.arange(4000), 256).ravel()  # ~1M values: std error ~0.0013
    assert abs(g.mean() - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(g.std() - math.pi / math.sqrt(6)) < 0.01


def test_rejects_bad_seed():
    with pytest.raises(ValueError):
        gumbel_noise(-1, [0], 4)
    with pytest.raises(ValueError):
        gumbel_noise(2**64, [0], 4)


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    params = SamplingParams(temperature=0.8)
    tokens = sample_tokens(logits, params, seed=9, positions=np.arange(20000))
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    expected = torch.softmax(logits[0].double() / 0.8, dim=-1)
    assert (freq - expected).abs().max() < 0.01


def test_top_p_keeps_the_nucleus_only():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(5000, 1)
    probs = torch.softmax(logits[0].double(), -1)
    params = SamplingParams(temperature=1.0, top_p=0.8)
    tokens = sample_tokens(logits, params, seed=1, positions=np.arange(5000))
    # mass before token j: 0, p0, p0+p1, ...; nucleus = those below 0.8.
    before = torch.cat([torch.zeros(1, dtype=torch.float64), probs.cumsum(0)[:-1]])
    allowed = set(torch.nonzero(before < 0.8).ravel().tolist())
    assert set(tokens.tolist()) == allowed


def test_mass_before_with_ties():
    logits = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    before = mass_before(logits, 1.0)[0]
    p_hi = math.e / (2 * math.e + 2)
    torch.testing.assert_close(before, torch.tensor([0.0, 0.0, 2 * p_hi, 2 * p_hi], dtype=torch.float64))


def test_scores_scale_with_temperature():
    logits = torch.randn(3, 10)
    s1 = seeded_scores(logits, 1.0, 5, [0, 1, 2])
    s2 = seeded_scores(logits, 2.0, 5, [0, 1, 2])
    torch.testing.assert_close(s1 - s2, logits.double() / 2)


def test_sampling_params_are_strict():
    with pytest.raises(ValueError):
        SamplingParams.model_validate({"temperature": "1.0"})
    with pytest.raises(ValueError):
        SamplingParams.model_validate({"temperature": 1.0, "top_k": 5})


def test_noise_with_a_seed_per_row_is_each_seeds_own_noise():
    seeds = [3, 3, 2**64 - 1, 0, 7]
    positions = [0, 1, 0, 4, 2]
    rows = gumbel_noise(seeds, positions, 256)
    for i, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        assert np.array_equal(rows[i], gumbel_noise(seed, [position], 256)[0])
    with pytest.raises(ValueError, match="one per position"):
        gumbel_noise([1, 2], [0, 1, 2], 256)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        gumbel_noise([1, -1], [0, 1], 256)
