"""Bit fields of the sparse codec's payload: fixed-width unsigned fields and Elias-Fano offsets.

Every function works on a whole group of equal chunks at once: row r of an array is chunk r (numpy,
no loop per chunk or per value). A field is a bit string packed most significant bit first (numpy's
`packbits` order: bit j of a field is bit 7 - j % 8 of its byte j // 8), zero-padded to a whole
byte; decoding refuses a set padding bit, so every accepted field is the canonical encoding.

Elias-Fano field of k strictly increasing offsets o_0 < ... < o_{k-1} in [0, L), with
l = `elias_fano_low_bits(L, k)` low bits per offset:

    low    k fields of l bits, o_i & (2^l - 1)                              k * l bits
    high   k + ((L - 1) >> l) bits; bit (o_i >> l) + i set for each i,      k + ((L - 1) >> l) bits
           every other bit clear (the high parts in unary)
    zero bits up to a whole byte

The high array has no bit to spare: the last offset's bit lies at most at ((L - 1) >> l) + k - 1.
Its k set bits, in order, give the high parts (position of the i-th set bit minus i), so the high
parts can never decrease; equal high parts must come with increasing low parts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from protocol.errors import InvalidMessage

__all__ = [
    "elias_fano_bytes",
    "elias_fano_decode",
    "elias_fano_encode",
    "elias_fano_low_bits",
    "pack_bits",
    "unpack_bits",
]

Fields = npt.NDArray[np.int64]
Bits = npt.NDArray[np.uint8]


def pack_bits(values: Fields | Bits, width: int) -> Bits:
    """[n, k] unsigned values of `width` (at most 16) bits -> [n, ceil(k * width / 8)] bytes, MSB first."""
    return np.packbits(_field_bits(values, width), axis=1)


def unpack_bits(raw: Bits, k: int, width: int) -> Fields:
    """Inverse of `pack_bits`; InvalidMessage if a padding bit is set."""
    _check_padding(np.unpackbits(raw, axis=1), k * width)
    return _read_fields(raw, k, width)


def elias_fano_low_bits(length: int, k: int) -> int:
    """l of k offsets in [0, length): the smallest l >= 0 minimising the field's k * l + k +
    ((length - 1) >> l) bits (searched up to (length - 1).bit_length(): past it the high array
    stays k bits while the low fields grow)."""
    top = max(length - 1, 0)
    return min(range(top.bit_length() + 1), key=lambda low: k * low + (top >> low))


def elias_fano_bytes(length: int, k: int) -> int:
    """Bytes of the Elias-Fano field of k offsets in [0, length), padding included."""
    return -(-_elias_fano_bit_count(length, k) // 8)


def elias_fano_encode(offsets: Fields, length: int) -> Bits:
    """[n, k] offsets, strictly increasing along each row, in [0, length) -> [n, field bytes]."""
    n, k = offsets.shape
    low = elias_fano_low_bits(length, k)
    bits = np.zeros((n, 8 * elias_fano_bytes(length, k)), dtype=np.uint8)
    bits[:, : k * low] = _field_bits(offsets & ((1 << low) - 1), low)
    np.put_along_axis(bits, k * low + (offsets >> low) + np.arange(k), 1, axis=1)
    return np.packbits(bits, axis=1)


def elias_fano_decode(raw: Bits, k: int, length: int) -> Fields:
    """Inverse of `elias_fano_encode` for untrusted [n, field bytes] rows: InvalidMessage unless each
    row is the canonical encoding of k strictly increasing offsets in [0, length)."""
    n = raw.shape[0]
    low = elias_fano_low_bits(length, k)
    high_bits = k + ((length - 1) >> low)
    bits = np.unpackbits(raw, axis=1)
    _check_padding(bits, k * low + high_bits)
    high = bits[:, k * low : k * low + high_bits].view(np.bool_)  # nonzero is fastest on bools
    ones = np.count_nonzero(high, axis=1)
    if bool((ones != k).any()):
        got = int(ones[np.flatnonzero(ones != k)[0]])
        raise InvalidMessage(
            f"Elias-Fano index field has {got} set bits in its high array; {k} kept offsets set exactly {k}"
        )
    positions = np.flatnonzero(high).reshape(n, k) - high_bits * np.arange(n, dtype=np.int64)[:, None]
    offsets: Fields = ((positions - np.arange(k)) << low) | _read_fields(raw, k, low)
    if bool((offsets >= length).any()):
        raise InvalidMessage(f"Elias-Fano index field has an index past its chunk's {length} values")
    if k > 1 and bool((np.diff(offsets, axis=1) <= 0).any()):
        raise InvalidMessage("Elias-Fano index field has indices that are not strictly increasing in a chunk")
    return offsets


def _elias_fano_bit_count(length: int, k: int) -> int:
    low = elias_fano_low_bits(length, k)
    return k * low + k + ((length - 1) >> low)


def _field_bits(values: Fields | Bits, width: int) -> Bits:
    """[n, k] unsigned values of `width` (at most 16) bits -> [n, k * width] bits (0 or 1), MSB first."""
    if not 0 <= width <= 16:
        raise ValueError(f"bit fields are 0 to 16 bits wide, not {width}")
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint32)
    bits = ((values.astype(np.uint32)[..., None] >> shifts) & 1).astype(np.uint8)
    return bits.reshape(values.shape[0], -1)


def _read_fields(raw: Bits, k: int, width: int) -> Fields:
    """The first k `width`-bit fields of each row of [n, >= ceil(k * width / 8)] bytes, MSB first.

    Field i lies within the 3 bytes from byte (i * width) // 8 (width + 7 <= 24 bits), read big-endian
    as one integer and shifted: one gather per byte of all fields of all rows.
    """
    if not 0 <= width <= 16:
        raise ValueError(f"bit fields are 0 to 16 bits wide, not {width}")
    starts = np.arange(k, dtype=np.int64) * width
    first = starts // 8
    padded = np.zeros((raw.shape[0], raw.shape[1] + 3), dtype=np.uint8)
    padded[:, : raw.shape[1]] = raw
    window = (
        (padded[:, first].astype(np.uint32) << 16)
        | (padded[:, first + 1].astype(np.uint32) << 8)
        | padded[:, first + 2]
    )
    shifts = (24 - width - starts % 8).astype(np.uint32)
    fields: Fields = ((window >> shifts) & ((1 << width) - 1)).astype(np.int64)
    return fields


def _check_padding(bits: Bits, used: int) -> None:
    if bool(bits[:, used:].any()):
        raise InvalidMessage("sparse payload has nonzero padding bits after a bit field")
