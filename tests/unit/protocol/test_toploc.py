"""Tests for protocol.toploc: byte identity with the reference vectors, and strictness."""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest
import torch

from protocol.errors import InvalidProofError
from protocol.toploc import (
    FIELD_PRIME,
    NO_MATCH_ERROR,
    _chunks_topk,
    _evaluate,
    _interpolate,
    build_proofs,
    verify_proofs,
    verify_proofs_batch,
)
from tests.helpers.paths import TEST_DATA

GOLDEN = TEST_DATA / "toploc" / "golden.json"


def _load_golden() -> list[dict]:
    # the reference vectors are required: a missing file must fail the suite, not skip it
    assert GOLDEN.exists(), f"reference vectors not found at {GOLDEN}"
    return json.loads(GOLDEN.read_text())["cases"]


def _tensor(b64: str, shape: list[int]) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.bfloat16).view(*shape)


def _figures(check) -> dict:
    return {
        "exp_mismatches": check.exp_mismatches,
        "mant_err_mean": check.mant_err_mean,
        "mant_err_median": check.mant_err_median,
    }


@pytest.fixture(scope="module")
def golden() -> list[dict]:
    return _load_golden()


def test_golden_cases_cover_partial_chunk_and_forced_modulus(golden):
    names = {c["name"]: c for c in golden}
    assert any(c["shape"][0] % 32 for c in golden), "a case with a partial last chunk"
    assert any(m != FIELD_PRIME for c in names.values() for m in c["moduli"]), "a case with m < p"


def test_proofs_are_byte_identical_to_reference(golden):
    for case in golden:
        act = _tensor(case["activations_bf16_le_b64"], case["shape"])
        ours = build_proofs(act)
        ref = [base64.b64decode(p) for p in case["proofs_b64"]]
        assert ours == ref, case["name"]
        assert [int.from_bytes(p[:2], "big") for p in ours] == case["moduli"]
        assert all(len(p) == 258 for p in ours)


def test_verification_figures_identical_to_reference(golden):
    for case in golden:
        ref = [base64.b64decode(p) for p in case["proofs_b64"]]
        act = _tensor(case["activations_bf16_le_b64"], case["shape"])
        pert = _tensor(case["perturbed_bf16_le_b64"], case["shape"])
        same = verify_proofs(act, ref)
        assert [_figures(c) for c in same] == case["verify_same"], case["name"]
        assert all(c.sign_mismatches == 0 for c in same)
        assert [_figures(c) for c in verify_proofs(pert, ref)] == case["verify_perturbed"], case["name"]


def _naive_interpolate(xs: list[int], ys: list[int]) -> list[int]:
    """Lagrange interpolation over GF(p), one term at a time (slow, obviously correct)."""
    p = FIELD_PRIME
    k = len(xs)
    coeffs = [0] * k
    for i in range(k):
        basis = [1]
        denom = 1
        for j in range(k):
            if j == i:
                continue
            basis = [(a - xs[j] * b) % p for a, b in zip([0, *basis], [*basis, 0], strict=True)]
            denom = denom * (xs[i] - xs[j]) % p
        scale = ys[i] * pow(denom, p - 2, p) % p
        coeffs = [(c + scale * b) % p for c, b in zip(coeffs, basis, strict=True)]
    return coeffs


@pytest.mark.parametrize("k", [1, 2, 3, 7, 16, 33, 128])
def test_vectorised_interpolation_matches_naive(k):
    rng = random.Random(k)
    xs = rng.sample(range(FIELD_PRIME), k)
    ys = [rng.randrange(FIELD_PRIME) for _ in range(k)]
    coeffs = _interpolate(np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64))
    assert coeffs.tolist() == _naive_interpolate(xs, ys)
    assert _evaluate(coeffs, np.array(xs, dtype=np.int64)).tolist() == ys


def _horner(coeffs: list[int], x: int) -> int:
    value = 0
    for c in reversed(coeffs):
        value = (value * x + c) % FIELD_PRIME
    return value


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 15, 16, 17, 100, 127, 128])
def test_batched_evaluation_matches_horner(n):
    """`_evaluate` (baby-step giant-step, batched) equals plain Horner, also at the field's extremes."""
    rng = np.random.default_rng(n)
    coeffs = rng.integers(0, FIELD_PRIME, size=(3, n))
    points = rng.integers(0, 2 * FIELD_PRIME, size=(3, 40))  # indices beyond p are reduced mod p
    coeffs[2] = FIELD_PRIME - 1  # largest terms: every product is (p - 1) ** 2
    points[2, :20] = FIELD_PRIME - 1
    points[2, 20] = 0
    values = _evaluate(coeffs, points)
    assert values.shape == points.shape
    for row in range(3):
        expected = [_horner(coeffs[row].tolist(), int(x) % FIELD_PRIME) for x in points[row]]
        assert values[row].tolist() == expected


@pytest.mark.parametrize("levels", [1, 2, 7, 1000])
def test_batched_topk_breaks_ties_like_the_references_one_chunk_calls(levels):
    """Proofs pick the top-k of each chunk with one batched call; bf16 activations tie often, and
    the reference calls `topk` on each flattened chunk alone: the indices must be the same."""
    g = torch.Generator().manual_seed(levels)

    def activations(tokens: int) -> torch.Tensor:
        return (torch.randint(-levels, levels + 1, (tokens, 64), generator=g).float() / levels).to(
            torch.bfloat16
        )

    # Several rollouts at once, their short last chunks of equal and of different sizes.
    hiddens = [activations(200), activations(8), activations(40), activations(1), activations(8)]
    all_tops = _chunks_topk(hiddens, 32, 128)
    assert [len(tops) for tops in all_tops] == [7, 1, 2, 1, 1]  # 200 tokens: six full chunks and a short one
    for hidden, tops in zip(hiddens, all_tops, strict=True):
        for i, (idx, bits) in enumerate(tops):
            flat = hidden[i * 32 : (i + 1) * 32].reshape(-1)
            assert np.array_equal(idx, flat.abs().topk(min(128, flat.numel())).indices.numpy())
            assert np.array_equal(bits, flat[idx].view(torch.int16).numpy().astype(np.int64) & 0xFFFF)


@pytest.mark.parametrize(("tokens", "hidden"), [(1, 128), (31, 64), (33, 96), (64, 128), (5, 8)])
def test_round_trip_honest_is_exact(tokens, hidden):
    torch.manual_seed(tokens * 1000 + hidden)
    act = torch.randn(tokens, hidden).to(torch.bfloat16)
    proofs = build_proofs(act)
    assert len(proofs) == -(-tokens // 32)
    checks = verify_proofs(act, proofs)
    for c in checks:
        assert (c.exp_mismatches, c.mant_err_mean, c.mant_err_median, c.sign_mismatches) == (0, 0.0, 0.0, 0)
    # A chunk with fewer values than topk commits to all of them.
    assert checks[-1].topk == min(128, (tokens - 32 * (len(proofs) - 1)) * hidden)


def test_negated_activations_caught_by_sign_check():
    torch.manual_seed(1)
    act = torch.randn(40, 128).to(torch.bfloat16)
    checks = verify_proofs(-act, build_proofs(act))
    # The reference's three figures are blind to the sign ...
    assert all(c.exp_mismatches == 0 and c.mant_err_mean == 0.0 for c in checks)
    # ... ours is not.
    assert all(c.sign_mismatches == c.topk for c in checks)


def test_other_activations_mismatch():
    torch.manual_seed(2)
    act = torch.randn(32, 128).to(torch.bfloat16)
    other = torch.randn(32, 128).to(torch.bfloat16)
    (check,) = verify_proofs(other, build_proofs(act))
    assert check.exp_mismatches > 100


def test_no_exponent_match_reports_2_pow_64():
    act = torch.full((1, 128), 1.0).to(torch.bfloat16)
    proof = bytearray(build_proofs(act)[0])
    # A constant polynomial whose value has exponent 0: every exponent mismatches.
    proof[2:] = bytes(len(proof) - 2)
    (check,) = verify_proofs(act, [bytes(proof)])
    assert check.exp_mismatches == 128
    assert check.mant_err_mean == NO_MATCH_ERROR and check.mant_err_median == NO_MATCH_ERROR


@pytest.fixture(scope="module")
def honest() -> tuple[torch.Tensor, list[bytes]]:
    torch.manual_seed(3)
    act = torch.randn(70, 128).to(torch.bfloat16)
    return act, build_proofs(act)


def _with_modulus(proof: bytes, m: int) -> bytes:
    return m.to_bytes(2, "big") + proof[2:]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda ps: [ps[0][:-1], *ps[1:]], "bytes"),
        (lambda ps: [ps[0] + b"\x00\x00", *ps[1:]], "bytes"),
        (lambda ps: [b"", *ps[1:]], "bytes"),
        (lambda ps: [_with_modulus(ps[0], 0), *ps[1:]], "modulus 0"),
        (lambda ps: [_with_modulus(ps[0], FIELD_PRIME + 1), *ps[1:]], "modulus 65498"),
        (lambda ps: [_with_modulus(ps[0], 65535), *ps[1:]], "modulus 65535"),
        (lambda ps: [ps[0][:2] + b"\xff\xff" + ps[0][4:], *ps[1:]], "outside the field"),
        (lambda ps: ps[:-1], "expected 3"),
        (lambda ps: [*ps, ps[0]], "expected 3"),
        (lambda ps: [], "expected 3"),
        (lambda ps: ["not bytes", *ps[1:]], "must be bytes"),
        (lambda ps: b"".join(ps), "list of bytes"),
    ],
)
def test_malformed_proofs_raise_invalid_proof_error(honest, mutate, reason):
    act, proofs = honest
    with pytest.raises(InvalidProofError, match=reason):
        verify_proofs(act, mutate(list(proofs)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int16])
def test_non_bf16_activations_raise(honest, dtype):
    act, proofs = honest
    with pytest.raises(InvalidProofError, match="bfloat16"):
        verify_proofs(act.to(dtype), proofs)
    with pytest.raises(InvalidProofError, match="bfloat16"):
        build_proofs(act.to(dtype))


@pytest.mark.parametrize("shape", [(128,), (0, 128), (2, 32, 64)])
def test_bad_activation_shapes_raise(shape):
    with pytest.raises(InvalidProofError, match="tokens, hidden"):
        build_proofs(torch.zeros(shape, dtype=torch.bfloat16))


def test_invalid_proof_error_is_a_value_error_and_hivenet_error():
    from protocol.errors import HivenetError

    assert issubclass(InvalidProofError, ValueError)
    assert issubclass(InvalidProofError, HivenetError)


def test_small_modulus_does_not_crash(honest):
    act, proofs = honest
    checks = verify_proofs(act, [_with_modulus(p, 1) for p in proofs])
    assert all(c.exp_mismatches > 0 for c in checks)


def test_a_batch_gives_each_rollout_what_verifying_it_alone_gives(honest):
    """Honest, tampered and malformed rollouts of several lengths (so several k) in one batch: each
    result is that rollout's own checks, or the very error verifying it alone raises."""
    act, proofs = honest
    torch.manual_seed(4)
    short = torch.randn(1, 64).to(torch.bfloat16)  # one chunk of 64 values: k = 64
    other = torch.randn(70, 128).to(torch.bfloat16)
    rollouts = [
        (act, proofs),
        (short, build_proofs(short)),
        (-act, proofs),
        (act, proofs[:-1]),  # malformed: a proof is missing
        (other, proofs),
        (act.float(), proofs),  # malformed: not bf16
        (short, [_with_modulus(build_proofs(short)[0], 1)]),
    ]
    results = verify_proofs_batch(rollouts)
    assert len(results) == len(rollouts)
    for (hidden, ps), result in zip(rollouts, results, strict=True):
        try:
            alone = verify_proofs(hidden, ps)
        except InvalidProofError as e:
            assert isinstance(result, InvalidProofError) and str(result) == str(e)
        else:
            assert result == alone
    assert [isinstance(r, InvalidProofError) for r in results] == [
        False,
        False,
        False,
        True,
        False,
        True,
        False,
    ]
    assert verify_proofs_batch([]) == []
