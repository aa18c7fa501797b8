"""Bit fields of the sparse codec: fixed-width fields and Elias-Fano offsets, many chunks (rows) at
once; decoding of untrusted rows accepts exactly the canonical encodings (hypothesis fuzz)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.collective.bitfields import (
    elias_fano_bytes,
    elias_fano_decode,
    elias_fano_encode,
    elias_fano_low_bits,
    pack_bits,
    unpack_bits,
)
from protocol.errors import InvalidMessage
from tests.helpers.fuzzing import FAST


def _rows(length: int, k: int, n: int, seed: int) -> np.ndarray:
    """n rows of k sorted distinct offsets in [0, length)."""
    rng = np.random.default_rng(seed)
    return np.sort(np.stack([rng.choice(length, size=k, replace=False) for _ in range(n)]), axis=1)


def test_pack_bits_is_msb_first_and_refuses_padding() -> None:
    values = np.array([[5, 0, 7], [1, 2, 3]], dtype=np.int64)
    packed = pack_bits(values, 3)  # 9 bits: 2 bytes, 7 padding bits
    assert packed.tolist() == [[0b101_000_11, 0b1_0000000], [0b001_010_01, 0b1_0000000]]
    np.testing.assert_array_equal(unpack_bits(packed, 3, 3), values)
    packed[1, 1] |= 1
    with pytest.raises(InvalidMessage, match="padding"):
        unpack_bits(packed, 3, 3)


@pytest.mark.parametrize("length", [1, 2, 3, 10, 63, 64, 65, 1000, 4095, 4096, 65536])
def test_low_bits_is_the_smallest_l_of_the_fewest_bits(length: int) -> None:
    for k in sorted({1, 2, 3, 7, length // 64, length // 3, length // 2, length} - {0}):
        costs = [k * low + k + ((length - 1) >> low) for low in range(20)]
        low = elias_fano_low_bits(length, k)
        assert low == costs.index(min(costs)), (length, k)
        assert elias_fano_bytes(length, k) == -(-costs[low] // 8)
    assert elias_fano_low_bits(4096, 61) == 6 and elias_fano_bytes(4096, 61) == 62  # 490 bits


@pytest.mark.parametrize(
    ("length", "k"),
    [
        (1, 1),  # k = L
        (2, 2),
        (3, 2),
        (10, 1),
        (64, 1),
        (64, 6),
        (64, 64),
        (100, 99),
        (576, 9),  # the short last chunk of a million values at the default config
        (4096, 1),
        (4096, 61),  # the default config
        (4096, 2048),
        (65536, 1),
        (65536, 983),
        (65536, 65536),
    ],
)
def test_elias_fano_round_trip_of_many_rows(length: int, k: int) -> None:
    offsets = _rows(length, k, n=5, seed=length + k)
    raw = elias_fano_encode(offsets, length)
    assert raw.shape == (5, elias_fano_bytes(length, k)) and raw.dtype == np.uint8
    np.testing.assert_array_equal(elias_fano_decode(raw, k, length), offsets)


def test_elias_fano_extremes() -> None:
    every = np.arange(64, dtype=np.int64)[None, :]  # k = L, l = 0: bit 2i of the 127-bit high array
    assert elias_fano_encode(every, 64).tolist() == [[0b10101010] * 16]
    last = np.array([[4095]], dtype=np.int64)  # k = 1: l = 11, low 11111111111, high bit 1 of 2
    assert elias_fano_encode(last, 4096).tolist() == [[0xFF, 0b111_01_000]]


def test_one_bad_row_among_many_is_refused() -> None:
    offsets = _rows(4096, 61, n=50, seed=1)
    raw = elias_fano_encode(offsets, 4096)
    # 366 low bits, a 124-bit high array, 6 padding bits: flip a high bit, then a padding bit.
    for bit, match in [(366 + 37, "set bits"), (8 * 62 - 1, "padding")]:
        bad = raw.copy()
        bad[37, bit // 8] ^= 0x80 >> (bit % 8)
        with pytest.raises(InvalidMessage, match=match):
            elias_fano_decode(bad, 61, 4096)


@pytest.mark.parametrize(
    ("bits", "length", "k", "match"),
    [
        ("01" + "001" + "000", 10, 1, None),  # 9 = 2 << 2 | 1
        ("10" + "001" + "000", 10, 1, "index past"),  # 10
        ("00" + "011" + "000", 10, 1, "set bits"),
        ("00" + "000" + "000", 10, 1, "0 set bits"),
        ("00" + "001" + "100", 10, 1, "padding"),
        # 6 offsets < 64, l = 3: lows 0 5 5 ..., equal high parts 0 0 0: not increasing
        ("000101101000110111" + "1110000010011" + "0", 64, 6, "increasing"),
        ("000101100000110111" + "1110000010011" + "0", 64, 6, "increasing"),  # 0 5 4
        ("000101001000110111" + "1100100010011" + "0", 64, 6, None),  # 0 5 17 40 62 63
    ],
)
def test_elias_fano_decode_is_strict(bits: str, length: int, k: int, match: str | None) -> None:
    raw = np.frombuffer(int(bits, 2).to_bytes(len(bits) // 8, "big"), dtype=np.uint8)[None, :]
    if match is None:
        np.testing.assert_array_equal(elias_fano_encode(elias_fano_decode(raw, k, length), length), raw)
        return
    with pytest.raises(InvalidMessage, match=match):
        elias_fano_decode(raw, k, length)


CASES = st.sampled_from([(1, 1), (3, 2), (10, 1), (31, 3), (64, 6), (64, 32), (256, 77), (188, 56)])


@st.composite
def _untrusted(draw: st.DrawFn) -> tuple[int, int, np.ndarray]:
    """(length, k, rows): any bytes, or valid rows with a few bits flipped."""
    length, k = draw(CASES)
    nbytes, n = elias_fano_bytes(length, k), draw(st.integers(1, 4))
    if draw(st.booleans()):
        data = draw(st.binary(min_size=n * nbytes, max_size=n * nbytes))
        return length, k, np.frombuffer(data, dtype=np.uint8).reshape(n, nbytes).copy()
    rows = elias_fano_encode(_rows(length, k, n, seed=draw(st.integers(0, 2**16))), length)
    for bit in draw(st.lists(st.integers(0, 8 * n * nbytes - 1), max_size=3)):
        rows.reshape(-1)[bit // 8] ^= 0x80 >> (bit % 8)
    return length, k, rows


@settings(FAST, max_examples=300)
@given(_untrusted())
def test_elias_fano_decode_accepts_exactly_the_canonical_encodings(case: tuple[int, int, np.ndarray]) -> None:
    length, k, raw = case
    try:
        offsets = elias_fano_decode(raw, k, length)
    except InvalidMessage:
        return
    assert offsets.shape == (raw.shape[0], k)
    assert bool((offsets >= 0).all() and (offsets < length).all())
    assert bool((np.diff(offsets, axis=1) > 0).all())
    np.testing.assert_array_equal(elias_fano_encode(offsets, length), raw)  # the only encoding
