"""Pseudo-gradient codecs: int8 and SparseLoCo-style sparse, their wire layouts, error feedback, and
decoding of untrusted bytes (hypothesis fuzz plus hand-built malformed payloads).

The layout checks parse and build payloads with this file's own bit packing (not the module's), so
a codec that drifts from its documented layout fails here.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from node.collective.codecs import (
    CODEC_NAMES,
    DenseInt8Codec,
    PseudoGradCodec,
    SparseLoCoCodec,
    codec_for,
)
from protocol.errors import ConfigError, InvalidMessage
from tests.helpers.fuzzing import FAST, mutated

LEVELS = (-1.5, -0.5, 0.5, 1.5)


def _random(shapes: Sequence[Sequence[int]], seed: int = 0) -> list[torch.Tensor]:
    """Random float32 tensors without zeros (so a kept value never decodes to 0 by accident)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        x = torch.randn(tuple(shape), generator=gen)
        out.append(x + 0.01 * torch.where(x >= 0, 1.0, -1.0))
    return out


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def _kept(density: float, length: int) -> int:
    return max(1, round(density * length))


def _chunk_lengths(numel: int, chunk: int) -> list[int]:
    full, last = divmod(numel, chunk)
    return [chunk] * full + ([last] if last else [])


def _bits(values: Sequence[int], width: int) -> bytes:
    """MSB-first fixed-width fields, zero-padded to a whole byte (an independent implementation)."""
    acc = 0
    for v in values:
        acc = (acc << width) | v
    total = len(values) * width
    nbytes = -(-total // 8)
    return (acc << (8 * nbytes - total)).to_bytes(nbytes, "big")


def _sparse_payload(
    chunk: int, k_full: int, records: Sequence[tuple[float, Sequence[int], Sequence[int]]]
) -> bytes:
    """A sparse payload from (scale, indices, codes) per chunk, built from the documented layout."""
    out = struct.pack("<2sBBII", b"HV", 2, 1, chunk, k_full)
    width = chunk.bit_length() - 1
    for scale, idx, codes in records:
        out += struct.pack("<f", scale) + _bits(idx, width) + _bits(codes, 2)
    return out


# ----------------------------------------------------------------------------------------- int8


INT8_SHAPES = [(3, 100), (7,), (), (2, 2, 40)]  # 468 values: one full block and a ragged one


def test_int8_round_trip_is_within_half_a_step_of_each_block() -> None:
    codec = DenseInt8Codec(INT8_SHAPES)
    tensors = _random(INT8_SHAPES)
    tensors[1][3] = 0.0
    decoded = codec.decode(codec.encode(tensors))
    assert [tuple(t.shape) for t in decoded] == INT8_SHAPES
    assert all(t.dtype == torch.float32 for t in decoded)
    x, y = _flat(tensors), _flat(decoded)
    for start in range(0, x.numel(), 256):
        block = x[start : start + 256]
        step = float(block.abs().max()) / 127
        err = (block - y[start : start + 256]).abs().max()
        assert float(err) <= 0.5 * step * (1 + 1e-5), f"block at {start}"
    assert float(y[100 * 3 + 3]) == 0.0


def test_int8_payload_follows_the_documented_layout_exactly() -> None:
    codec = DenseInt8Codec(INT8_SHAPES)
    tensors = _random(INT8_SHAPES, seed=3)
    payload = codec.encode(tensors)
    numel, blocks = 468, 2
    assert len(payload) == 4 + 4 * blocks + numel == codec.max_payload_bytes()
    assert payload[:4] == b"HV\x01\x01"
    scales = np.frombuffer(payload, dtype="<f4", count=blocks, offset=4).astype(np.float32)
    codes = np.frombuffer(payload, dtype=np.int8, offset=4 + 4 * blocks)
    expected = codes.astype(np.float32) * np.repeat(scales, 256)[:numel]
    got = _flat(codec.decode(payload)).numpy()
    assert got.tobytes() == expected.tobytes()  # value = code * scale in float32, bit for bit


def test_int8_is_deterministic_and_stateless() -> None:
    codec = DenseInt8Codec(INT8_SHAPES)
    tensors = _random(INT8_SHAPES, seed=5)
    first = codec.encode(tensors)
    assert codec.encode(tensors) == first
    a, b = codec.decode(first), DenseInt8Codec(INT8_SHAPES).decode(first)
    assert all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(a, b, strict=True))


def test_int8_rejects_a_code_of_minus_128_and_bad_scales() -> None:
    codec = DenseInt8Codec([(10,)])
    payload = bytearray(codec.encode(_random([(10,)])))
    bad_code = bytearray(payload)
    bad_code[-1] = 0x80
    with pytest.raises(InvalidMessage, match="-128"):
        codec.decode(bytes(bad_code))
    for scale in (math.nan, math.inf, -1.0, 3e38):
        bad_scale = bytearray(payload)
        bad_scale[4:8] = struct.pack("<f", scale)
        with pytest.raises(InvalidMessage, match="scale"):
            codec.decode(bytes(bad_scale))


# --------------------------------------------------------------------------------------- sparse


SPARSE_SHAPES = [(50, 100), (37,), (5,)]  # 5042 values: four chunks of 1024 and one of 946


def test_sparse_keeps_exactly_k_per_chunk_at_the_top_k_positions() -> None:
    codec = SparseLoCoCodec(SPARSE_SHAPES, density=0.05, chunk_values=1024)
    tensors = _random(SPARSE_SHAPES, seed=1)
    decoded = codec.decode(codec.encode(tensors))
    assert [tuple(t.shape) for t in decoded] == SPARSE_SHAPES
    x, y = _flat(tensors).numpy(), _flat(decoded).numpy()
    lengths = _chunk_lengths(x.size, 1024)
    assert lengths == [1024] * 4 + [946]
    start = 0
    for length in lengths:
        k = _kept(0.05, length)
        kept = np.flatnonzero(y[start : start + length])
        assert kept.size == k
        top = np.sort(np.argsort(-np.abs(x[start : start + length]), kind="stable")[:k])
        np.testing.assert_array_equal(kept, top)
        start += length


def test_sparse_ties_go_to_the_lowest_offsets() -> None:
    codec = SparseLoCoCodec([(64 * 3,)], density=0.1, chunk_values=64)  # k = 6
    x = torch.ones(192)
    x[70] = -2.0  # chunk 1: one value above the tie, then five tied ones from the chunk's start
    x[130:] = torch.tensor([1.0, -1.0] * 31)  # chunk 2: all tied in magnitude, signs alternate
    y = codec.decode(codec.encode([x]))[0]
    kept = torch.nonzero(y).reshape(-1).tolist()
    assert kept == [0, 1, 2, 3, 4, 5, 64, 65, 66, 67, 68, 70, 128, 129, 130, 131, 132, 133]


def test_sparse_payload_follows_the_documented_layout_exactly() -> None:
    shapes = [(64,), (10,)]  # one chunk of 64 (k = 6), one of 10 (k = 1); 6-bit indices
    codec = SparseLoCoCodec(shapes, density=0.1, chunk_values=64)
    tensors = _random(shapes, seed=2)
    payload = codec.encode(tensors)
    assert len(payload) == 12 + (4 + 5 + 2) + (4 + 1 + 1) == codec.max_payload_bytes()
    y = _flat(codec.decode(payload)).numpy()
    # Rebuild the payload with this file's own packer from the scales read at their documented
    # offsets and the decoded values: the same bytes.
    records = []
    for start, length, scale_at in ((0, 64, 12), (64, 10, 12 + 11)):
        scale = struct.unpack_from("<f", payload, scale_at)[0]
        idx = [int(i) for i in np.flatnonzero(y[start : start + length])]
        ratios = y[start + np.array(idx)] / np.float32(scale)
        codes = [int(np.argmin([abs(r - level) for level in LEVELS])) for r in ratios]
        records.append((scale, idx, codes))
    assert [len(r[1]) for r in records] == [6, 1]
    assert _sparse_payload(64, 6, records) == payload


def test_sparse_hand_built_payload_decodes_to_level_times_scale() -> None:
    codec = SparseLoCoCodec([(64,), (10,)], density=0.1, chunk_values=64)
    payload = _sparse_payload(64, 6, [(0.3, [0, 5, 17, 40, 62, 63], [0, 1, 2, 3, 0, 3]), (2.0, [9], [1])])
    y = _flat(codec.decode(payload)).numpy()
    s = np.float32(0.3)
    expected = np.zeros(74, dtype=np.float32)
    expected[[0, 5, 17, 40, 62, 63]] = np.array([LEVELS[c] for c in (0, 1, 2, 3, 0, 3)], np.float32) * s
    expected[64 + 9] = np.float32(-0.5) * np.float32(2.0)
    assert y.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    ("shapes", "chunk"),
    [
        ([(10,)], 4096),  # one tensor smaller than a chunk
        ([(3,), (2, 2), ()], 64),  # several tiny tensors sharing one short chunk
        ([(4096,)], 4096),  # exactly one chunk
        ([(4097,)], 4096),  # a ragged last chunk of one value
        ([(3, 1000), (5000,)], 4096),  # a chunk spanning two tensors, ragged end
        ([(0,), (70,)], 64),  # an empty tensor
        ([(65536 + 777,)], 65536),  # 16-bit indices
    ],
)
def test_sparse_payload_length_is_fixed_and_exact(shapes: list[tuple[int, ...]], chunk: int) -> None:
    density = 0.03
    codec = SparseLoCoCodec(shapes, density=density, chunk_values=chunk)
    width = chunk.bit_length() - 1
    numel = sum(math.prod(s) for s in shapes)
    expected = 12 + sum(
        4 + -(-_kept(density, n) * width // 8) + -(-_kept(density, n) // 4)
        for n in _chunk_lengths(numel, chunk)
    )
    assert codec.max_payload_bytes() == expected
    for seed in range(2):
        payload = codec.encode(_random(shapes, seed))
        assert len(payload) == expected
        assert [tuple(t.shape) for t in codec.decode(payload)] == [tuple(s) for s in shapes]


def test_compression_ratios_of_a_million_values() -> None:
    shapes = [(1000, 768), (768,), (231232,)]
    sparse = codec_for("sparse", shapes, density=0.015, chunk_values=4096)
    int8 = codec_for("int8", shapes)
    assert sparse.compression_ratio() > 100
    assert sparse.compression_ratio() == 4_000_000 / sparse.max_payload_bytes()
    assert 3.9 < int8.compression_ratio() < 4.0


def test_quantizer_keeps_signs_and_beats_sign_times_mean_magnitude() -> None:
    gen = torch.Generator().manual_seed(7)
    # A Gaussian chunk and a heavy-tailed one (where the outer level matters).
    x = torch.cat([torch.randn(1024, generator=gen), torch.randn(1024, generator=gen) ** 3])
    codec = SparseLoCoCodec([(2048,)], density=0.1, chunk_values=1024, error_feedback=False)
    y = codec.decode(codec.encode([x]))[0]
    for c in range(2):
        xs, ys = x[c * 1024 : (c + 1) * 1024], y[c * 1024 : (c + 1) * 1024]
        kept = ys != 0
        v, q = xs[kept].double(), ys[kept].double()
        assert torch.equal(torch.sign(v), torch.sign(q))
        baseline = torch.sign(v) * v.abs().mean()
        assert float(((v - q) ** 2).sum()) <= float(((v - baseline) ** 2).sum()) * (1 + 1e-5)
        assert float((v - q).norm() / v.norm()) < 0.5
    heavy = y[1024:][y[1024:] != 0].abs()
    assert len(set(heavy.tolist())) == 2  # both magnitude levels in use


# ------------------------------------------------------------------------------- error feedback


def _transmitted_sum(codec: SparseLoCoCodec, g: torch.Tensor, rounds: int) -> torch.Tensor:
    total = torch.zeros_like(g)
    for _ in range(rounds):
        total += codec.decode(codec.encode([g]))[0]
    return total


def test_error_feedback_makes_the_transmitted_sum_approach_the_true_sum() -> None:
    g = torch.randn(8192, generator=torch.Generator().manual_seed(11))
    with_ef = SparseLoCoCodec([(8192,)], density=0.05, error_feedback=True)
    without = SparseLoCoCodec([(8192,)], density=0.05, error_feedback=False)
    rel = {}
    for name, codec in (("ef", with_ef), ("none", without)):
        total = _transmitted_sum(codec, g, 100)
        rel[name] = float((total - 100 * g).norm() / (100 * g).norm())
        if name == "none":
            assert float((total == 0).float().mean()) > 0.9  # most coordinates never sent
    assert rel["ef"] < 0.1
    assert rel["none"] > 0.5


def test_error_feedback_decay_zero_drops_the_residual() -> None:
    g = _random([(3000,)], seed=4)
    decayed = SparseLoCoCodec([(3000,)], density=0.02, ef_decay=0.0)
    plain = SparseLoCoCodec([(3000,)], density=0.02, error_feedback=False)
    for _ in range(3):
        assert decayed.encode(g) == plain.encode(g)


def test_reset_forgets_the_error_feedback() -> None:
    g = _random([(5000,)], seed=6)
    codec = SparseLoCoCodec([(5000,)], density=0.02)
    fresh = codec.encode(g)
    second = codec.encode(g)
    assert second != fresh  # the residual changed what is sent
    codec.reset()
    assert codec.encode(g) == fresh


# ------------------------------------------------------------------------- untrusted payloads


FUZZ_SHAPES = [(3, 50), (7,), (130,)]  # 287 values
FUZZ_CODECS: dict[str, PseudoGradCodec] = {
    "int8": codec_for("int8", FUZZ_SHAPES),
    "sparse": codec_for("sparse", FUZZ_SHAPES, density=0.1, chunk_values=64),  # ragged last chunk
}
SEEDS = {name: codec.encode(_random(FUZZ_SHAPES, seed=9)) for name, codec in FUZZ_CODECS.items()}
HEADERS = {"int8": 4, "sparse": 12}


SCALES = st.floats(width=32) | st.sampled_from([3e38, 2.6e36, -0.0, 0.0, math.nan, math.inf])


@st.composite
def _structured(draw: st.DrawFn, name: str) -> bytes:
    """Payloads with a valid header and length whose fields are drawn: edge-case scales, indices
    out of range or out of order, any codes; these reach the checks behind the length check."""
    if name == "int8":
        scales = draw(st.lists(SCALES, min_size=2, max_size=2))
        int8_codes = draw(st.binary(min_size=287, max_size=287))
        return b"HV\x01\x01" + struct.pack("<2f", *scales) + int8_codes
    records = []
    for length, k in ((64, 6), (64, 6), (64, 6), (64, 6), (31, 3)):
        idx = draw(st.lists(st.integers(0, 63), min_size=k, max_size=k, unique=True))
        if draw(st.booleans()):
            idx = sorted(idx)
        if draw(st.booleans()):
            idx = sorted(draw(st.lists(st.integers(0, length - 1), min_size=k, max_size=k, unique=True)))
        codes = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        records.append((draw(SCALES), idx, codes))
    return _sparse_payload(64, 6, records)


def _payloads(name: str) -> st.SearchStrategy[bytes]:
    seed, header = SEEDS[name], HEADERS[name]
    return st.one_of(
        _structured(name),
        st.binary(max_size=2 * len(seed)),
        st.integers(0, len(seed) - 1).map(lambda n: seed[:n]),
        st.binary(min_size=1, max_size=64).map(lambda tail: seed + tail),
        st.tuples(st.integers(0, len(seed) - 1), st.integers(1, 255)).map(
            lambda e: seed[: e[0]] + bytes([seed[e[0]] ^ e[1]]) + seed[e[0] + 1 :]
        ),
        st.binary(min_size=len(seed) - header, max_size=len(seed) - header).map(
            lambda body: seed[:header] + body
        ),
        mutated(seed),
    )


def _decodes_cleanly_or_refuses(codec: PseudoGradCodec, payload: bytes) -> None:
    try:
        out = codec.decode(payload)
    except InvalidMessage:
        return
    assert [tuple(t.shape) for t in out] == list(codec.shapes)
    assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all()) for t in out)


@settings(FAST, max_examples=200)
@given(_payloads("int8"))
def test_int8_decode_of_untrusted_bytes(payload: bytes) -> None:
    _decodes_cleanly_or_refuses(FUZZ_CODECS["int8"], payload)


@settings(FAST, max_examples=200)
@given(_payloads("sparse"))
def test_sparse_decode_of_untrusted_bytes(payload: bytes) -> None:
    _decodes_cleanly_or_refuses(FUZZ_CODECS["sparse"], payload)


def test_seeds_decode() -> None:
    for name, codec in FUZZ_CODECS.items():
        codec.decode(SEEDS[name])  # the fuzz mutates valid payloads, not already-refused ones


GOOD_RECORDS = [(0.3, [0, 5, 17, 40, 62, 63], [0, 1, 2, 3, 0, 3]), (2.0, [9], [1])]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (_sparse_payload(64, 6, [GOOD_RECORDS[0], (2.0, [10], [1])]), "index past"),
        (_sparse_payload(64, 6, [GOOD_RECORDS[0], (2.0, [63], [1])]), "index past"),
        (_sparse_payload(64, 6, [(0.3, [0, 5, 5, 40, 62, 63], [0] * 6), GOOD_RECORDS[1]]), "increasing"),
        (_sparse_payload(64, 6, [(0.3, [0, 5, 4, 40, 62, 63], [0] * 6), GOOD_RECORDS[1]]), "increasing"),
        (_sparse_payload(64, 6, [(math.nan, *GOOD_RECORDS[0][1:]), GOOD_RECORDS[1]]), "scale"),
        (_sparse_payload(64, 6, [GOOD_RECORDS[0], (math.inf, [9], [1])]), "scale"),
        (_sparse_payload(64, 6, [GOOD_RECORDS[0], (-1.0, [9], [1])]), "scale"),
        (_sparse_payload(64, 6, [GOOD_RECORDS[0], (3e38, [9], [1])]), "scale"),  # 1.5 * s overflows
        (b"XX" + _sparse_payload(64, 6, GOOD_RECORDS)[2:], "magic"),
        (b"HV\x01" + _sparse_payload(64, 6, GOOD_RECORDS)[3:], "codec id"),
        (b"HV\x02\x02" + _sparse_payload(64, 6, GOOD_RECORDS)[4:], "version"),
        (_sparse_payload(64, 7, GOOD_RECORDS), "keeping"),  # too many kept values per chunk
        (_sparse_payload(128, 6, GOOD_RECORDS), "keeping"),
        (_sparse_payload(64, 6, GOOD_RECORDS)[:-1], "bytes"),
        (_sparse_payload(64, 6, GOOD_RECORDS) + b"\x00", "bytes"),
        (_sparse_payload(64, 6, GOOD_RECORDS)[:5], "header"),
        (_sparse_payload(64, 6, GOOD_RECORDS)[:-1] + b"\x01", "padding"),  # last code byte: 2 bits used
    ],
)
def test_sparse_refuses_malformed_payloads(payload: bytes, match: str) -> None:
    codec = SparseLoCoCodec([(64,), (10,)], density=0.1, chunk_values=64)
    codec.decode(_sparse_payload(64, 6, GOOD_RECORDS))  # the unmodified payload is valid
    with pytest.raises(InvalidMessage, match=match):
        codec.decode(payload)


def test_decode_refuses_a_payload_of_the_other_codec() -> None:
    shapes = [(300,)]
    int8, sparse = codec_for("int8", shapes), codec_for("sparse", shapes)
    with pytest.raises(InvalidMessage):
        sparse.decode(int8.encode(_random(shapes)))
    with pytest.raises(InvalidMessage):
        int8.decode(sparse.encode(_random(shapes)))


# ---------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("zstd", {}),
        ("sparse", {"density": 0.0}),
        ("sparse", {"density": 0.9}),
        ("sparse", {"density": math.nan}),
        ("sparse", {"chunk_values": 100}),
        ("sparse", {"chunk_values": 32}),
        ("sparse", {"chunk_values": 131072}),
        ("int8", {"density": -0.1}),
    ],
)
def test_codec_for_refuses_bad_configs(name: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        codec_for(name, [(10,)], **kwargs)  # type: ignore[arg-type]


def test_codec_for_builds_each_named_codec() -> None:
    assert CODEC_NAMES == ("int8", "sparse")
    int8 = codec_for("int8", [(2, 3)])
    sparse = codec_for("sparse", [[2, 3]], density=0.5, chunk_values=64, error_feedback=False)
    assert isinstance(int8, DenseInt8Codec) and int8.name == "int8"
    assert isinstance(sparse, SparseLoCoCodec) and sparse.name == "sparse"
    assert sparse.shapes == ((2, 3),) and sparse.k_full == 32 and not sparse.error_feedback


def test_encode_refuses_wrong_inputs() -> None:
    for codec in (DenseInt8Codec([(4,)]), SparseLoCoCodec([(4,)])):
        with pytest.raises(ValueError, match="expects 1 tensors"):
            codec.encode([])
        with pytest.raises(ValueError, match="float32"):
            codec.encode([torch.zeros(5)])
        with pytest.raises(ValueError, match="float32"):
            codec.encode([torch.zeros(4, dtype=torch.float64)])
        with pytest.raises(ValueError, match="non-finite"):
            codec.encode([torch.tensor([0.0, math.nan, 1.0, 2.0])])
