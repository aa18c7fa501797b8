"""Chunk bitmaps of the weight broadcast (which chunks of a version a peer holds) and the frame caps
that depend on them.

Bits are LSB-first within each byte; a bitmap received from a peer is checked by `parse_bitmap`
(exact length, no bits past the last chunk) before it is used.
"""

from __future__ import annotations

from protocol.errors import InvalidMessage
from protocol.limits import MAX_HAVE_BATCH


def bitmap_bytes(num_chunks: int) -> int:
    """Size of a chunk bitmap for `num_chunks` chunks."""
    return (num_chunks + 7) // 8


def parse_bitmap(data: bytes, num_chunks: int) -> bytearray:
    """Check an untrusted bitmap (exact length, no bits past the last chunk) and return a mutable copy."""
    if len(data) != bitmap_bytes(num_chunks):
        raise InvalidMessage(f"bitmap of {len(data)} bytes for {num_chunks} chunks")
    spare = bitmap_bytes(num_chunks) * 8 - num_chunks
    if spare and data[-1] >> (8 - spare):
        raise InvalidMessage("bitmap marks chunks past the last one")
    return bytearray(data)


def bitmap_get(bitmap: bytes | bytearray, index: int) -> bool:
    """Whether bit `index` is set (LSB-first within each byte)."""
    return bool(bitmap[index >> 3] & (1 << (index & 7)))


def bitmap_set(bitmap: bytearray, index: int) -> None:
    """Set bit `index`."""
    bitmap[index >> 3] |= 1 << (index & 7)


def bitmap_count(bitmap: bytes | bytearray) -> int:
    """Number of set bits."""
    return int.from_bytes(bitmap, "little").bit_count()


def have_update_cap(num_chunks: int) -> int:
    """The most bytes one HaveUpdate frame for a version of `num_chunks` chunks may take."""
    return 64 + bitmap_bytes(num_chunks) + 2 * 11 * MAX_HAVE_BATCH
