"""TOPLOC proofs over final hidden states, byte-compatible with the reference `toploc` 0.1.6.

A proof commits to the top-k (by magnitude) bf16 values of each chunk of `chunk_tokens`
generated tokens, as a polynomial over GF(65497) through the points
`(index mod m, bf16 bits)`. See `docs/toploc-spec.md` for the format; in short, one proof
is `m` (2 bytes big-endian) followed by k coefficients (lowest degree first, 2 bytes
big-endian each): 258 bytes for k = 128.

The format is shared by inference workers (who build proofs, `training.generation`) and
validators (who check them, `verification.verdict`), so it lives here as pure tensor math
with no I/O; the reference vectors in `tests/data/toploc/golden.json` pin its bytes.

* `build_proofs(hidden)` -> one `bytes` per chunk (what an inference worker sends).
* `verify_proofs(hidden, proofs)` -> one `ChunkCheck` per chunk with the reference's three
  figures (exponent mismatches, mean and upper-median mantissa error) plus the number of
  sign mismatches, which the reference never checks, and of values that differ at all.
* `verify_proofs_batch([(hidden, proofs), ...])` -> the same per rollout, evaluated together.

Where the reference is weak this module is stricter: every proof is validated (length,
modulus, coefficients in the field, number of proofs per chunk, bf16 2-D activations) before
anything is evaluated, and a malformed one raises `InvalidProofError` instead of crashing,
hanging or being read silently; evaluation always reduces indices modulo the proof's `m`.

Interpolation and evaluation are vectorised: with `P[i, j] = x_i^j`, the interpolating
polynomial's coefficients are `c = Hankel(M) @ (P^T @ w)` where `M` is `prod (X - x_i)`
(built by a product tree) and `w_i = y_i / M'(x_i)`. All products of two field elements
are below 2**32 and every dot product has at most a few thousand terms, so float64 BLAS
matrix products are exact before the final reduction mod p.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from protocol.errors import InvalidProofError

__all__ = [
    "CHUNK_TOKENS",
    "FIELD_PRIME",
    "NO_MATCH_ERROR",
    "TOPK",
    "ChunkCheck",
    "build_proofs",
    "num_chunks",
    "proof_length",
    "verify_proofs",
    "verify_proofs_batch",
]

FIELD_PRIME = 65497
"""The prime field of the reference implementation; also the largest allowed modulus."""

CHUNK_TOKENS = 32
"""Tokens per proof (`decode_batching_size` in the reference)."""

TOPK = 128
"""Values committed per proof (k); a proof is 2 + 2k bytes."""

NO_MATCH_ERROR = float(2**64)
"""Mantissa mean/median the reference reports when no exponent matches at all."""

_NP_INT = np.int64


@dataclass(frozen=True)
class ChunkCheck:
    """What verifying one chunk's proof against recomputed activations found.

    The first three figures are exactly those of the reference verifier; `sign_mismatches`
    (the reference accepts negated activations) and `value_mismatches` are hivenet's.
    """

    exp_mismatches: int
    """Top-k positions whose bf16 exponent differs from the proof's value (0..k)."""

    mant_err_mean: float
    """Mean |mantissa difference| over positions whose exponents match (2**64 if none)."""

    mant_err_median: float
    """Upper median (`sorted[n // 2]`) of the same mantissa differences (2**64 if none)."""

    sign_mismatches: int
    """Top-k positions whose sign bit differs from the proof's value (0..k)."""

    value_mismatches: int
    """Top-k positions whose 16 bits differ from the proof's value in any way (0..k)."""

    topk: int
    """Number of positions compared (k, or fewer for a chunk with fewer values than k)."""


def num_chunks(num_tokens: int, chunk_tokens: int = CHUNK_TOKENS) -> int:
    """Number of proofs for `num_tokens` generated tokens (the last chunk may be partial)."""
    return -(-num_tokens // chunk_tokens)


def proof_length(chunk_values: int, topk: int = TOPK) -> int:
    """Byte length of the proof of a chunk holding `chunk_values` activations."""
    return 2 + 2 * min(topk, chunk_values)


# ---------------------------------------------------------------- field arithmetic (vectorised)


def _mod_p(v: np.ndarray) -> np.ndarray:
    """`v mod p` as int64 for float64 arrays of non-negative exact integers below 2**53.

    (Converting to int64 and using `%` is exact and about 25x faster than `np.fmod`.)
    """
    return v.astype(_NP_INT) % FIELD_PRIME


def _powers(x: np.ndarray, n: int) -> np.ndarray:
    """`P[..., i, j] = x[..., i] ** j mod p` for j < n, as float64 (exact integers), by doubling."""
    p = FIELD_PRIME
    out = np.empty((*x.shape, n), dtype=_NP_INT)
    out[..., 0] = 1
    width = 1
    while width < n:
        xw = (out[..., width - 1] * x) % p  # x ** width
        cnt = min(width, n - width)
        out[..., width : width + cnt] = (out[..., :cnt] * xw[..., None]) % p
        width += cnt
    return out.astype(np.float64)


@functools.lru_cache(maxsize=16)
def _hankel_index(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices `m + j + 1` of `H[j, m]` and the mask where they stay within degree k."""
    j, m = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    idx = m + j + 1
    valid = idx <= k
    return np.where(valid, idx, 0), valid


def _master_poly(x: np.ndarray) -> np.ndarray:
    """Ascending coefficients (length k + 1) of `prod_i (X - x_i)` mod p, by a product tree."""
    p = FIELD_PRIME
    k = x.shape[0]
    n = 1 << max(0, math.ceil(math.log2(k)))
    leaves = np.zeros((n, 2), dtype=_NP_INT)
    leaves[:, 0] = 1  # padding leaves are the constant 1
    leaves[:k, 0] = (-x) % p
    leaves[:k, 1] = 1
    polys = leaves
    while polys.shape[0] > 1:
        # Multiply neighbours: convolution as the sum over i of row i shifted right by i,
        # done by padding each row of the outer product and re-viewing it (no Python loop).
        n2, length = polys.shape[0] // 2, polys.shape[1]
        outer = polys[0::2, :, None] * polys[1::2, None, :]  # each product < 2**32
        padded = np.zeros((n2, length, 2 * length), dtype=_NP_INT)
        padded[:, :, :length] = outer
        shifted = padded.reshape(n2, -1)[:, : length * (2 * length - 1)].reshape(n2, length, -1)
        polys = shifted.sum(axis=1) % p
    return polys[0, : k + 1]


def _inverse_mod_p(a: np.ndarray) -> np.ndarray:
    """Elementwise `a ** (p - 2) mod p` (Fermat inverse; `a` must be non-zero mod p)."""
    p = FIELD_PRIME
    result = np.ones_like(a)
    base = a % p
    e = p - 2
    while e:
        if e & 1:
            result = (result * base) % p
        base = (base * base) % p
        e >>= 1
    return result


def _interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (ascending, length k) of the polynomial of degree < k through `(x_i, y_i)`.

    `x` must be distinct field elements; arithmetic is over GF(65497).
    """
    p = FIELD_PRIME
    k = x.shape[0]
    master = _master_poly(x)
    deriv = (np.arange(1, k + 1, dtype=_NP_INT) * master[1:]) % p  # M'(X), ascending, length k
    powers = _powers(x, k)
    deriv_at_x = _mod_p(powers @ deriv.astype(np.float64))
    w = (y % p) * _inverse_mod_p(deriv_at_x) % p
    u = _mod_p(powers.T @ w.astype(np.float64)).astype(np.float64)
    hidx, valid = _hankel_index(k)
    hankel = np.where(valid, master[hidx], 0).astype(np.float64)
    return _mod_p(hankel @ u)


_TABLE_POWERS = math.isqrt(TOPK - 1) + 2
"""Columns of the power table: enough for `_evaluate` on polynomials of up to TOPK coefficients."""


@functools.cache
def _power_table() -> np.ndarray:
    """`T[x, j] = x ** j mod p` for every field element x and j < `_TABLE_POWERS`, as float64 (6.8 MB).

    A verifier evaluates every proof at k points: looking their powers up costs a gather where
    building them costs a dozen passes of integer arithmetic per call.
    """
    return _powers(np.arange(FIELD_PRIME, dtype=_NP_INT), _TABLE_POWERS)


def _evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Values mod p of polynomials with ascending `coeffs [..., n]` at points `x [..., k]`.

    Baby-step giant-step: with `s ~ sqrt(n)`, `c(x) = sum_a (x^s)^a * sum_b c[a s + b] x^b`,
    so only `s` powers of `x` and `ceil(n / s)` powers of `x^s` are needed (instead of `n`)
    and both sums are float64 matrix products with terms below 2**32 (exact).
    """
    p = FIELD_PRIME
    n = coeffs.shape[-1]
    x = x % p
    s = math.isqrt(n - 1) + 1 if n > 1 else 1
    blocks = -(-n // s)  # <= s
    c = np.zeros((*coeffs.shape[:-1], blocks * s), dtype=np.float64)
    c[..., :n] = coeffs
    if s < _TABLE_POWERS:
        table = _power_table()
        baby = table[x, :s]  # [..., k, s]
        giant = table[table[x, s].astype(_NP_INT), :blocks]  # (x^s)^a
    else:
        baby = _powers(x, s)
        giant = _powers((baby[..., -1].astype(_NP_INT) * x) % p, blocks)
    # inner[..., k, a] = sum_b x^b c[a s + b]   (s terms < 2**32 each)
    inner = _mod_p(np.matmul(baby, np.swapaxes(c.reshape(*c.shape[:-1], blocks, s), -1, -2)))
    values = np.einsum("...ka,...ka->...k", inner.astype(np.float64), giant)  # blocks terms < 2**32 each
    return _mod_p(values)


def _injective_modulus(idx: np.ndarray) -> int:
    """Largest `m <= 65497` such that the `idx mod m` are distinct (the reference's search)."""
    for m in range(FIELD_PRIME, 0, -1):
        if np.unique(idx % m).shape[0] == idx.shape[0]:
            return m
    raise AssertionError("no injective modulus found")  # unreachable: m = 1 .. works when k == 1


# ------------------------------------------------------------------------------- public API


def _check_hidden(hidden: object, chunk_tokens: int, topk: int) -> torch.Tensor:
    if chunk_tokens < 1 or topk < 1:
        raise ValueError(f"chunk_tokens ({chunk_tokens}) and topk ({topk}) must be positive")
    if not isinstance(hidden, torch.Tensor):
        raise InvalidProofError(f"activations must be a torch.Tensor, got {type(hidden).__name__}")
    if hidden.dtype != torch.bfloat16:
        raise InvalidProofError(
            f"activations must be bfloat16 (proofs commit to bf16 bits), got {hidden.dtype}; "
            "cast the final hidden states with .to(torch.bfloat16)"
        )
    if hidden.dim() != 2 or hidden.shape[0] == 0 or hidden.shape[1] == 0:
        raise InvalidProofError(
            f"activations must be a non-empty [tokens, hidden] tensor, got shape {tuple(hidden.shape)}"
        )
    return hidden.detach().cpu().contiguous()


def _chunks_topk(
    hiddens: Sequence[torch.Tensor], chunk_tokens: int, topk: int
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per rollout, per chunk of `chunk_tokens` rows: top-k indices of |values| (flattened) and their bf16 bits.

    Tie-breaking is torch CPU's `topk`, as in the reference. Chunks holding as many values,
    of any rollout, go through one batched `topk` over rows (the same per-row algorithm as the
    reference's 1-D call on each chunk; a test holds it to that).
    """
    chunks = [
        (r, hidden[start : start + chunk_tokens].reshape(-1))
        for r, hidden in enumerate(hiddens)
        for start in range(0, hidden.shape[0], chunk_tokens)
    ]
    by_size: dict[int, list[int]] = {}
    for j, (_, flat) in enumerate(chunks):
        by_size.setdefault(flat.numel(), []).append(j)
    found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for size, members in by_size.items():
        values = torch.stack([chunks[j][1] for j in members])
        idx = values.abs().topk(min(topk, size), dim=-1).indices
        bits = values.gather(-1, idx).view(torch.int16).numpy().astype(_NP_INT) & 0xFFFF
        indices = idx.numpy().astype(_NP_INT)
        for row, j in enumerate(members):
            found[j] = (indices[row], bits[row])
    out: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in hiddens]
    for j, (r, _) in enumerate(chunks):
        out[r].append(found[j])
    return out


def build_proofs(hidden: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS, topk: int = TOPK) -> list[bytes]:
    """Build one TOPLOC proof per `chunk_tokens` rows of `hidden` (`[T, H]`, bfloat16).

    Byte-identical to the reference's `build_proofs_bytes(..., skip_prefill=True)`. A final
    chunk with fewer than `topk` values commits to all of them (the reference fails there).
    Raises `InvalidProofError` if `hidden` is not a 2-D bf16 tensor.
    """
    hidden = _check_hidden(hidden, chunk_tokens, topk)
    proofs = []
    for idx, bits in _chunks_topk([hidden], chunk_tokens, topk)[0]:
        modulus = _injective_modulus(idx)
        coeffs = _interpolate(idx % modulus, bits)
        out = np.empty(1 + coeffs.shape[0], dtype=">u2")
        out[0] = modulus
        out[1:] = coeffs
        proofs.append(out.tobytes())
    return proofs


def _parse_proof(proof: object, expected_len: int, chunk: int) -> tuple[int, np.ndarray]:
    if not isinstance(proof, bytes | bytearray | memoryview):
        raise InvalidProofError(f"proof {chunk} must be bytes, got {type(proof).__name__}")
    raw = bytes(proof)
    if len(raw) != expected_len:
        raise InvalidProofError(
            f"proof {chunk} is {len(raw)} bytes, expected {expected_len} (2 + 2 * topk); "
            "it is truncated, padded or built with another topk"
        )
    words = np.frombuffer(raw, dtype=">u2").astype(_NP_INT)
    modulus = int(words[0])
    if not 0 < modulus <= FIELD_PRIME:
        raise InvalidProofError(f"proof {chunk} has modulus {modulus}, outside 1..{FIELD_PRIME}")
    coeffs = words[1:]
    if int(coeffs.max()) >= FIELD_PRIME:
        raise InvalidProofError(f"proof {chunk} has a coefficient outside the field GF({FIELD_PRIME})")
    return modulus, coeffs


def verify_proofs(
    hidden: torch.Tensor,
    proofs: list[bytes],
    chunk_tokens: int = CHUNK_TOKENS,
    topk: int = TOPK,
) -> list[ChunkCheck]:
    """Check `proofs` against the verifier's own activations `hidden` (`[T, H]`, bfloat16).

    Returns one `ChunkCheck` per chunk, with the same exponent/mantissa figures as the
    reference's C++ verifier. Raises `InvalidProofError` (before evaluating anything) if the
    number of proofs is not one per chunk, a proof has the wrong length, a modulus of 0 or
    above 65497 or a coefficient outside the field, or `hidden` is not a 2-D bf16 tensor.
    """
    result = verify_proofs_batch([(hidden, proofs)], chunk_tokens, topk)[0]
    if isinstance(result, InvalidProofError):
        raise result
    return result


def verify_proofs_batch(
    rollouts: Sequence[tuple[torch.Tensor, list[bytes]]],
    chunk_tokens: int = CHUNK_TOKENS,
    topk: int = TOPK,
) -> list[list[ChunkCheck] | InvalidProofError]:
    """`verify_proofs` on several `(hidden, proofs)` at once: per rollout, its checks or its error.

    Each result is what `verify_proofs` returns for that rollout alone, or the `InvalidProofError`
    it raises; one malformed rollout does not stop the others. The proofs of every rollout are
    evaluated together (chunks with the same k share one batched matrix product), which saves
    the per-call overhead that dominates for a group of short completions.
    """
    parsed: list[tuple[torch.Tensor, list[tuple[int, np.ndarray]]] | InvalidProofError] = []
    for hidden, proofs in rollouts:
        try:
            parsed.append(_parse_rollout(hidden, proofs, chunk_tokens, topk))
        except InvalidProofError as e:
            parsed.append(e)
    well_formed = {r: item for r, item in enumerate(parsed) if not isinstance(item, InvalidProofError)}

    # Recompute the top-k per chunk (the reference's tie-breaking), then evaluate every proof
    # of every rollout at once: chunks with the same k share one batched matrix product.
    tops = dict(
        zip(
            well_formed,
            _chunks_topk([hidden for hidden, _ in well_formed.values()], chunk_tokens, topk),
            strict=True,
        )
    )
    chunks = [
        (r, c, idx, bits, modulus, coeffs)
        for r, (_, proofs) in well_formed.items()
        for c, ((idx, bits), (modulus, coeffs)) in enumerate(zip(tops[r], proofs, strict=True))
    ]
    checks: dict[tuple[int, int], ChunkCheck] = {}
    for k in {idx.shape[0] for _, _, idx, _, _, _ in chunks}:
        same = [chunk for chunk in chunks if chunk[2].shape[0] == k]
        coeffs = np.stack([chunk[5] for chunk in same])
        points = np.stack([chunk[2] % chunk[4] for chunk in same])
        bits = np.stack([chunk[3] for chunk in same])
        for chunk, check in zip(same, _chunk_checks(bits, _evaluate(coeffs, points)), strict=True):
            checks[chunk[0], chunk[1]] = check

    return [
        item if isinstance(item, InvalidProofError) else [checks[r, c] for c in range(len(tops[r]))]
        for r, item in enumerate(parsed)
    ]


def _parse_rollout(
    hidden: torch.Tensor, proofs: list[bytes], chunk_tokens: int, topk: int
) -> tuple[torch.Tensor, list[tuple[int, np.ndarray]]]:
    """The checked activations and the parsed proofs, once both are known to be well formed."""
    hidden = _check_hidden(hidden, chunk_tokens, topk)
    if not isinstance(proofs, list | tuple):
        raise InvalidProofError(f"proofs must be a list of bytes, got {type(proofs).__name__}")
    t, h = hidden.shape
    expected = num_chunks(t, chunk_tokens)
    if len(proofs) != expected:
        raise InvalidProofError(
            f"got {len(proofs)} proofs for {t} tokens, expected {expected} (one per {chunk_tokens} tokens)"
        )
    parsed = []
    for i, proof in enumerate(proofs):
        rows = min(chunk_tokens, t - i * chunk_tokens)
        parsed.append(_parse_proof(proof, proof_length(rows * h, topk), i))
    return hidden, parsed


def _chunk_checks(bits: np.ndarray, claimed: np.ndarray) -> list[ChunkCheck]:
    """The figures of each chunk: row i of `bits` (recomputed) and `claimed` (the proof's values), `[n, k]`."""
    k = bits.shape[1]
    exp_mismatch = ((claimed & 0x7F80) >> 7) != ((bits & 0x7F80) >> 7)
    errors = np.abs((claimed & 0x7F) - (bits & 0x7F))
    # each row's errors where the exponents match come first, ascending (a mismatch sorts last)
    ranked = np.sort(np.where(exp_mismatch, np.iinfo(_NP_INT).max, errors), axis=1)
    matched = k - np.count_nonzero(exp_mismatch, axis=1)
    sums = np.where(exp_mismatch, 0, errors).sum(axis=1)
    signs = np.count_nonzero((claimed >> 15) != (bits >> 15), axis=1)
    values = np.count_nonzero(claimed != bits, axis=1)
    out = []
    for row in range(bits.shape[0]):
        count = int(matched[row])
        if count:
            mean, median = float(sums[row]) / count, float(ranked[row, count // 2])
        else:
            mean = median = NO_MATCH_ERROR
        out.append(
            ChunkCheck(
                exp_mismatches=k - count,
                mant_err_mean=mean,
                mant_err_median=median,
                sign_mismatches=int(signs[row]),
                value_mismatches=int(values[row]),
                topk=k,
            )
        )
    return out
