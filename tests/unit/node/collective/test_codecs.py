"""Pseudo-gradient codecs: int8 and SparseLoCo-style sparse, their wire layouts, error feedback, and
decoding of untrusted bytes (hypothesis fuzz plus hand-built malformed payloads).

The layout checks parse and build payloads with this file's own bit packing and Elias-Fano coding
(pure Python, not the module's), so a codec that drifts from its documented layout fails here; the
sparse fuzz compares the codec's decoding with this file's reference decoder of the layout.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
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


Record = tuple[float, list[int], list[int]]
"""(scale, kept offsets, 2-bit codes) of one chunk of a sparse payload."""


def _ef_low_bits(length: int, k: int) -> int:
    """The documented l, by brute force: the smallest l minimising the index field's bits."""
    costs = [k * low + k + ((length - 1) >> low) for low in range(18)]
    return costs.index(min(costs))


def _ef_sizes(length: int, k: int) -> tuple[int, int, int]:
    """(l, bits of the high array, bytes of the whole index field) for k offsets in [0, length)."""
    low = _ef_low_bits(length, k)
    high = k + ((length - 1) >> low)
    return low, high, -(-(k * low + high) // 8)


def _bitstring(bits: Sequence[int], nbytes: int) -> bytes:
    """`bits` MSB first, zero-padded (or cut) to `nbytes` bytes."""
    padded = (list(bits) + [0] * (8 * nbytes))[: 8 * nbytes]
    return int("".join(map(str, padded)) or "0", 2).to_bytes(nbytes, "big")


def _ef_field(offsets: Sequence[int], length: int) -> bytes:
    """The documented Elias-Fano index field of `offsets`, built as written even when they are out
    of order or range: a high bit past the array lands in the padding (past the field: dropped)."""
    k = len(offsets)
    low, _, nbytes = _ef_sizes(length, k)
    lows = [(o >> (low - 1 - j)) & 1 for o in offsets for j in range(low)]
    high = [0] * (8 * nbytes)
    for i, o in enumerate(offsets):
        if (o >> low) + i < len(high):
            high[(o >> low) + i] = 1
    return _bitstring(lows + high, nbytes)


def _sparse_payload(chunk: int, k_full: int, records: Sequence[Record], lengths: Sequence[int]) -> bytes:
    """A sparse payload from a record per chunk (of `lengths` values), built from the documented layout."""
    out = struct.pack("<2sBBII", b"HV", 2, 2, chunk, k_full)
    for (scale, idx, codes), length in zip(records, lengths, strict=True):
        out += struct.pack("<f", scale) + _ef_field(idx, length) + _bits(codes, 2)
    return out


def _sparse_size(density: float, lengths: Sequence[int]) -> int:
    return 12 + sum(4 + _ef_sizes(n, _kept(density, n))[2] + -(-_kept(density, n) // 4) for n in lengths)


def _field_bits(data: bytes) -> str:
    return "".join(f"{b:08b}" for b in data)


def _reference_records(
    payload: bytes, chunk: int, density: float, lengths: Sequence[int]
) -> list[Record] | None:
    """The records of a sparse payload, read by the documented layout alone; None if it breaks any rule."""
    header = struct.pack("<2sBBII", b"HV", 2, 2, chunk, _kept(density, chunk))
    if payload[:12] != header or len(payload) != _sparse_size(density, lengths):
        return None
    records, pos = [], 12
    for length in lengths:
        k = _kept(density, length)
        low, high_bits, nbytes = _ef_sizes(length, k)
        (scale,) = struct.unpack_from("<f", payload, pos)
        with np.errstate(over="ignore", invalid="ignore"):
            if payload[pos + 3] & 0x80 or not np.isfinite(np.float32(scale) * np.float32(1.5)):
                return None
        bits = _field_bits(payload[pos + 4 : pos + 4 + nbytes])
        code_bits = _field_bits(payload[pos + 4 + nbytes : pos + 4 + nbytes + -(-k // 4)])
        pos += 4 + nbytes + -(-k // 4)
        ones = [j for j, bit in enumerate(bits[k * low : k * low + high_bits]) if bit == "1"]
        if "1" in bits[k * low + high_bits :] or "1" in code_bits[2 * k :] or len(ones) != k:
            return None
        idx = [((p - i) << low) | int(bits[i * low : (i + 1) * low] or "0", 2) for i, p in enumerate(ones)]
        if any(o >= length for o in idx) or any(b <= a for a, b in itertools.pairwise(idx)):
            return None
        records.append((scale, idx, [int(code_bits[2 * i : 2 * i + 2], 2) for i in range(k)]))
    return records


def _reference_values(records: Sequence[Record], lengths: Sequence[int]) -> npt.NDArray[np.float32]:
    """What the layout says `records` decode to: level * scale in float32 at the kept offsets, else 0."""
    out = np.zeros(sum(lengths), dtype=np.float32)
    start = 0
    for (scale, idx, codes), length in zip(records, lengths, strict=True):
        levels = np.array([LEVELS[c] for c in codes], dtype=np.float32)
        out[start + np.array(idx, dtype=np.int64)] = levels * np.float32(scale)
        start += length
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
SMALL = (64, 10)  # the chunk lengths of shapes [(64,), (10,)] in chunks of 64


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
    shapes = [(64,), (10,)]  # one chunk of 64 (k = 6), one of 10 (k = 1)
    codec = SparseLoCoCodec(shapes, density=0.1, chunk_values=64)
    tensors = _random(shapes, seed=2)
    payload = codec.encode(tensors)
    # Index fields: 6 offsets < 64 with l = 3 (18 + 13 bits), 1 offset < 10 with l = 2 (2 + 3 bits).
    assert len(payload) == 12 + (4 + 4 + 2) + (4 + 1 + 1) == codec.max_payload_bytes()
    y = _flat(codec.decode(payload)).numpy()
    # Rebuild the payload with this file's own packer from the scales read at their documented
    # offsets and the decoded values: the same bytes.
    records = []
    for start, length, scale_at in ((0, 64, 12), (64, 10, 12 + 10)):
        scale = struct.unpack_from("<f", payload, scale_at)[0]
        idx = [int(i) for i in np.flatnonzero(y[start : start + length])]
        ratios = y[start + np.array(idx)] / np.float32(scale)
        codes = [int(np.argmin([abs(r - level) for level in LEVELS])) for r in ratios]
        records.append((scale, idx, codes))
    assert [len(r[1]) for r in records] == [6, 1]
    assert _sparse_payload(64, 6, records, SMALL) == payload
    assert _reference_records(payload, 64, 0.1, SMALL) == records


def test_sparse_hand_built_payload_decodes_to_level_times_scale() -> None:
    codec = SparseLoCoCodec([(64,), (10,)], density=0.1, chunk_values=64)
    payload = _sparse_payload(
        64, 6, [(0.3, [0, 5, 17, 40, 62, 63], [0, 1, 2, 3, 0, 3]), (2.0, [9], [1])], SMALL
    )
    # By hand: chunk 0 (l = 3) has the low parts 000 101 001 000 110 111, the high parts 0 0 2 5 7 7
    # set bits 0 1 4 8 11 12 of its 13-bit high array, then one padding bit; chunk 1 (l = 2) sends
    # 9 as low part 01 and high part 2 (bit 2 of 3 set), then 3 padding bits.
    assert payload[16:20] == int("000101001000110111" + "1100100010011" + "0", 2).to_bytes(4, "big")
    assert payload[26] == 0b01_001_000
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
    numel = sum(math.prod(s) for s in shapes)
    expected = _sparse_size(density, _chunk_lengths(numel, chunk))
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


def _lloyd_scale(v: npt.NDArray[np.float32]) -> float:
    """The quantizer's documented scale, in float64: Lloyd steps from s = 2 * mean|v|."""
    mag = np.abs(v).astype(np.float64)
    s = 2.0 * mag.mean()
    for _ in range(3):
        level = np.where(mag >= s, 1.5, 0.5)
        s = float((mag * level).sum() / (level * level).sum())
    return s


@pytest.mark.parametrize(
    ("numel", "chunk", "density"),
    [
        (64 * 5 + 17, 64, 0.1),  # k = 6; a short last chunk of 17 keeping 2
        (64 * 3 + 1, 64, 0.5),  # k = 32 = L / 2; a last chunk of one value keeping it (k = L)
        (256 * 2 + 3, 256, 0.5),  # a last chunk of 3 keeping 2
        (1024 * 2 + 1023, 1024, 0.3),
        (4096 * 3 + 1000, 4096, 0.015),  # the default config, k = 61 (l = 6)
        (4096 * 2 + 5, 4096, 0.0002),  # k = 1 everywhere
        (16384 + 100, 16384, 0.05),
        (65536 + 777, 65536, 0.03),
        (65536 + 3, 65536, 0.5),  # 32768 kept of 65536 (l = 0), then 2 of 3
    ],
)
def test_sparse_round_trip_is_top_k_and_the_quantizer(numel: int, chunk: int, density: float) -> None:
    """What decode(encode(x)) holds is exactly what the plain-offset format held: the top-k offsets
    of each chunk, each value quantized at its chunk's scale; and the payload is the documented one."""
    codec = SparseLoCoCodec([(numel,)], density=density, chunk_values=chunk)
    x = _random([(numel,)], seed=numel)[0]
    payload = codec.encode([x])
    lengths = _chunk_lengths(numel, chunk)
    records = _reference_records(payload, chunk, density, lengths)
    assert records is not None, "the codec's payload breaks the documented layout"
    assert _sparse_payload(chunk, _kept(density, chunk), records, lengths) == payload
    y = codec.decode(payload)[0].numpy()
    assert y.tobytes() == _reference_values(records, lengths).tobytes()
    xs, start = x.numpy(), 0
    for (scale, idx, codes), length in zip(records, lengths, strict=True):
        chunk_x = xs[start : start + length]
        k = _kept(density, length)
        top = np.sort(np.argsort(-np.abs(chunk_x), kind="stable")[:k])
        assert idx == top.tolist()
        v = chunk_x[top]
        outer = np.abs(v) >= np.float32(scale)
        assert codes == np.where(v >= 0, 2 + outer, 1 - outer).tolist()
        assert scale == pytest.approx(_lloyd_scale(v), rel=1e-6)
        start += length


def test_sparse_indices_take_fewer_bytes_than_plain_offsets() -> None:
    shapes = [(1000, 768), (768,), (231232,)]  # a million values: 244 chunks of 4096 and one of 576
    codec = SparseLoCoCodec(shapes)  # density 0.015, chunks of 4096: k = 61, 9 in the last chunk
    assert (codec.density, codec.chunk_values, codec.k_full) == (0.015, 4096, 61)
    plain_record = 4 + math.ceil(61 * 12 / 8) + math.ceil(61 / 4)  # 112: 12-bit offsets
    ef_record = 4 + math.ceil((61 * 6 + 61 + (4095 >> 6)) / 8) + math.ceil(61 / 4)  # 82: l = 6
    assert ef_record == 82 < plain_record == 112
    last = 4 + math.ceil((9 * 5 + 9 + (575 >> 5)) / 8) + math.ceil(9 / 4)  # l = 5
    assert codec.max_payload_bytes() == 12 + 244 * ef_record + last
    assert codec.max_payload_bytes() < 12 + 244 * plain_record + 4 + math.ceil(9 * 12 / 8) + 3
    # Every chunk size, full chunks and short ones: never larger than plain offsets from 3 kept
    # values, smaller from 8 (1 or 2 kept can take one byte more: the high array's k bits).
    for width in range(6, 17):
        chunk = 1 << width
        for length in (chunk, chunk - 1, chunk // 2 + 1, 33):
            for k in range(3, length // 2 + 1):
                plain, ef = -(-k * width // 8), _ef_sizes(length, k)[2]
                assert ef <= plain and (k < 8 or ef < plain), (chunk, length, k)


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


FUZZ_SHAPES = [(3, 50), (7,), (130,)]  # 287 values: four chunks of 64 keeping 6, one of 31 keeping 3
FUZZ_LENGTHS = (64, 64, 64, 64, 31)
WIDE_SHAPES = [(700,)]  # chunks of 256 keeping 77, 77 and (of 188) 56: longer Elias-Fano fields
WIDE_LENGTHS = (256, 256, 188)
FUZZ_CODECS: dict[str, PseudoGradCodec] = {
    "int8": codec_for("int8", FUZZ_SHAPES),
    "sparse": codec_for("sparse", FUZZ_SHAPES, density=0.1, chunk_values=64),  # ragged last chunk
    "sparse-wide": codec_for("sparse", WIDE_SHAPES, density=0.3, chunk_values=256),
}
SEEDS = {
    name: codec.encode(_random(WIDE_SHAPES if name == "sparse-wide" else FUZZ_SHAPES, seed=9))
    for name, codec in FUZZ_CODECS.items()
}
HEADERS = {"int8": 4, "sparse": 12, "sparse-wide": 12}
SPARSE_FUZZ = {"sparse": (64, 0.1, FUZZ_LENGTHS), "sparse-wide": (256, 0.3, WIDE_LENGTHS)}


SCALES = st.floats(width=32) | st.sampled_from([3e38, 2.6e36, -0.0, 0.0, math.nan, math.inf])


@st.composite
def _index_field(draw: st.DrawFn, length: int, k: int) -> bytes:
    """An index field for k offsets in [0, length): valid, built from any offsets, of k set high bits
    anywhere with any low parts (reaching the range and order checks), or any bytes."""
    low, high_bits, nbytes = _ef_sizes(length, k)
    kind = draw(st.sampled_from(("valid", "offsets", "k ones", "bytes")))
    if kind == "valid":
        return _ef_field(sorted(draw(st.sets(st.integers(0, length - 1), min_size=k, max_size=k))), length)
    if kind == "offsets":
        return _ef_field(draw(st.lists(st.integers(0, 2 * length), min_size=k, max_size=k)), length)
    if kind == "k ones":
        ones = set(draw(st.sets(st.integers(0, high_bits - 1), min_size=k, max_size=k)))
        lows = draw(st.lists(st.integers(0, (1 << low) - 1), min_size=k, max_size=k))
        bits = [(v >> (low - 1 - j)) & 1 for v in lows for j in range(low)]
        return _bitstring(bits + [int(j in ones) for j in range(high_bits)], nbytes)
    return draw(st.binary(min_size=nbytes, max_size=nbytes))


@st.composite
def _structured(draw: st.DrawFn, name: str) -> bytes:
    """Payloads with a valid header and length whose fields are drawn: edge-case scales, index
    fields of every kind, any codes; these reach the checks behind the length check."""
    if name == "int8":
        scales = draw(st.lists(SCALES, min_size=2, max_size=2))
        int8_codes = draw(st.binary(min_size=287, max_size=287))
        return b"HV\x01\x01" + struct.pack("<2f", *scales) + int8_codes
    chunk, density, lengths = SPARSE_FUZZ[name]
    out = struct.pack("<2sBBII", b"HV", 2, 2, chunk, _kept(density, chunk))
    for length in lengths:
        k = _kept(density, length)
        codes = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        out += struct.pack("<f", draw(SCALES)) + draw(_index_field(length, k)) + _bits(codes, 2)
    return out


def _flipped_bits(seed: bytes) -> st.SearchStrategy[bytes]:
    """`seed` with a few bits flipped: a set high bit too many or too few, a moved one, padding."""

    def flip(positions: list[int]) -> bytes:
        data = bytearray(seed)
        for p in positions:
            data[p // 8] ^= 0x80 >> (p % 8)
        return bytes(data)

    return st.lists(st.integers(0, 8 * len(seed) - 1), min_size=1, max_size=4).map(flip)


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
        _flipped_bits(seed),
        mutated(seed),
    )


def _decodes_cleanly_or_refuses(codec: PseudoGradCodec, payload: bytes) -> None:
    try:
        out = codec.decode(payload)
    except InvalidMessage:
        return
    assert [tuple(t.shape) for t in out] == list(codec.shapes)
    assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all()) for t in out)


def _decodes_as_the_layout_says(name: str, payload: bytes) -> None:
    """The codec decodes exactly the payloads the documented layout allows, to the values it gives."""
    codec, (chunk, density, lengths) = FUZZ_CODECS[name], SPARSE_FUZZ[name]
    records = _reference_records(payload, chunk, density, lengths)
    if records is None:
        with pytest.raises(InvalidMessage):
            codec.decode(payload)
        return
    out = _flat(codec.decode(payload)).numpy()
    assert out.tobytes() == _reference_values(records, lengths).tobytes()


@settings(FAST, max_examples=200)
@given(_payloads("int8"))
def test_int8_decode_of_untrusted_bytes(payload: bytes) -> None:
    _decodes_cleanly_or_refuses(FUZZ_CODECS["int8"], payload)


@settings(FAST, max_examples=200)
@given(_payloads("sparse"))
def test_sparse_decode_of_untrusted_bytes(payload: bytes) -> None:
    _decodes_cleanly_or_refuses(FUZZ_CODECS["sparse"], payload)
    _decodes_as_the_layout_says("sparse", payload)


@settings(FAST, max_examples=200)
@given(st.sampled_from(sorted(SPARSE_FUZZ)).flatmap(lambda name: st.tuples(st.just(name), _payloads(name))))
def test_sparse_decode_of_right_length_bytes_and_bit_flips(case: tuple[str, bytes]) -> None:
    name, payload = case
    _decodes_cleanly_or_refuses(FUZZ_CODECS[name], payload)
    _decodes_as_the_layout_says(name, payload)


def test_seeds_decode() -> None:
    for name, codec in FUZZ_CODECS.items():
        codec.decode(SEEDS[name])  # the fuzz mutates valid payloads, not already-refused ones
    for name, (chunk, density, lengths) in SPARSE_FUZZ.items():
        assert _reference_records(SEEDS[name], chunk, density, lengths) is not None


GOOD_RECORDS: list[Record] = [(0.3, [0, 5, 17, 40, 62, 63], [0, 1, 2, 3, 0, 3]), (2.0, [9], [1])]
GOOD = _sparse_payload(64, 6, GOOD_RECORDS, SMALL)
# Index fields of GOOD: chunk 0 at byte 16, l = 3: low bits 0-17, high array 18-30 (bits 18 + 0, 1,
# 4, 8, 11, 12 set), padding bit 31; chunk 1 at byte 26, l = 2: low bits 0-1, high array 2-4 (bit
# 2 + 2 set: offset 9 = 2 << 2 | 1), padding bits 5-7.


def _flip(payload: bytes, field_at: int, bit: int) -> bytes:
    """`payload` with bit `bit` (MSB first) of the field starting at byte `field_at` flipped."""
    data = bytearray(payload)
    data[field_at + bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(data)


def _good_with(first: Record | None = None, second: Record | None = None) -> bytes:
    return _sparse_payload(64, 6, [first or GOOD_RECORDS[0], second or GOOD_RECORDS[1]], SMALL)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (_good_with(second=(2.0, [10], [1])), "index past"),  # high 2, low 2
        (_good_with(second=(2.0, [11], [1])), "index past"),
        (_good_with(second=(2.0, [15], [1])), "padding"),  # high 3: past the 3-bit high array
        (_good_with(second=(2.0, [63], [1])), "set bits"),  # high 15: past the field, no bit set
        (_good_with((0.3, [0, 5, 5, 40, 62, 63], [0] * 6)), "increasing"),  # same high, same low
        (_good_with((0.3, [0, 5, 4, 40, 62, 63], [0] * 6)), "increasing"),  # same high, lower low
        (_good_with((0.3, [0, 5, 17, 40, 63, 62], [0] * 6)), "increasing"),
        (_flip(GOOD, 16, 18 + 2), "7 set bits"),  # one high bit too many
        (_flip(GOOD, 16, 18 + 12), "5 set bits"),  # one too few
        (_flip(_flip(GOOD, 16, 18 + 12), 16, 18 + 13), "padding"),  # the last one moved into the padding
        (_flip(GOOD, 16, 31), "padding"),
        (_flip(GOOD, 26, 2 + 1), "2 set bits"),
        (_flip(GOOD, 26, 2 + 2), "0 set bits"),
        (_flip(GOOD, 26, 5), "padding"),
        (_flip(GOOD, 26, 7), "padding"),
        (_good_with((math.nan, *GOOD_RECORDS[0][1:])), "scale"),
        (_good_with(second=(math.inf, [9], [1])), "scale"),
        (_good_with(second=(-1.0, [9], [1])), "scale"),
        (_good_with(second=(3e38, [9], [1])), "scale"),  # 1.5 * s overflows
        (b"XX" + GOOD[2:], "magic"),
        (b"HV\x01" + GOOD[3:], "codec id"),
        (b"HV\x02\x01" + GOOD[4:], "version"),  # plain 12-bit offsets, before Elias-Fano
        (b"HV\x02\x03" + GOOD[4:], "version"),
        (_sparse_payload(64, 7, GOOD_RECORDS, SMALL), "keeping"),  # too many kept values per chunk
        (_sparse_payload(128, 6, GOOD_RECORDS, SMALL), "keeping"),
        (GOOD[:-1], "bytes"),
        (GOOD + b"\x00", "bytes"),
        (GOOD[:5], "header"),
        (GOOD[:-1] + b"\x01", "padding"),  # last code byte: 2 bits used
    ],
)
def test_sparse_refuses_malformed_payloads(payload: bytes, match: str) -> None:
    codec = SparseLoCoCodec([(64,), (10,)], density=0.1, chunk_values=64)
    codec.decode(GOOD)  # the unmodified payload is valid
    with pytest.raises(InvalidMessage, match=match):
        codec.decode(payload)
    assert _reference_records(payload, 64, 0.1, SMALL) is None


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
