"""Pseudo-gradient codecs for DiLoCo's averaging round.

Each trainer encodes its pseudo-gradient (float32 CPU tensors, one per model parameter, shapes
fixed for the run) into one payload that it sends to every member of its group, and every member
decodes every contribution. Payloads come from untrusted peers: `decode` checks everything and
raises `InvalidMessage` on any malformed input. Its arithmetic is elementwise float32 (no
reduction), so every machine decodes a payload to bit-identical tensors.

Both codecs work on the flattened concatenation of all tensors (`numel` values). Numbers are
little-endian; bit fields are packed most significant bit first (bit j of a field is bit 7 - j % 8
of its byte j // 8), and the padding bits of a field (up to its last byte) must be zero.

``int8`` (`DenseInt8Codec`), stateless; blocks of 256 values, the last one possibly shorter:

    header   b"HV", codec id 1, version 1                           4 bytes
    scales   ceil(numel / 256) float32, absmax(block) / 127          4 bytes each (127 * scale finite)
    codes    numel int8 in [-127, 127], round(x / scale)             1 byte each
    decoded value = code * scale

``sparse`` (`SparseLoCoCodec`), SparseLoCo-style (arXiv 2508.15706) top-k with 2-bit values and
error feedback; chunks of `chunk_values` values, the last one possibly shorter (L values); a chunk
of L values keeps k_L = max(1, round(density * L)) of them:

    header   b"HV", codec id 2, version 2, chunk_values (uint32), k of a full chunk (uint32)  12 bytes
    then per chunk:
      scale    float32 s, 1.5 * s finite, sign bit clear             4 bytes
      indices  the k_L kept offsets o_0 < ... < o_{k_L - 1} in [0, L), Elias-Fano coded; l, the
               low bits of each, is the smallest l >= 0 minimising k_L * l + k_L + ((L - 1) >> l),
               the field's bits before padding:
        low    k_L fields of l bits, o_i & (2^l - 1)                  k_L * l bits
        high   bit (o_i >> l) + i set for each i, all others clear    k_L + ((L - 1) >> l) bits
        pad    zero bits up to a whole byte
      codes    k_L 2-bit codes; 0, 1, 2, 3 decode to (-1.5, -0.5, +0.5, +1.5) * s
    positions not kept decode to 0. The length is fixed by the shapes: `max_payload_bytes()`.
    A full chunk of 4096 at the default density (k = 61, l = 6) takes 4 + 62 + 16 bytes (plain
    12-bit offsets would take 92 index bytes). `bitfields` encodes and strictly decodes the
    fields: a payload decodes only if it is the canonical encoding of k_L increasing offsets < L.

The 2-bit quantizer sends each kept value v as the nearest of the levels ±0.5s, ±1.5s (magnitude
threshold at s), s fitted per chunk by Lloyd steps from s = 2 * mean|v| (the inner level is the mean
magnitude), so its squared error never exceeds that of sending sign(v) * mean|v|.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from node.collective.bitfields import (
    elias_fano_bytes,
    elias_fano_decode,
    elias_fano_encode,
    pack_bits,
    unpack_bits,
)
from protocol.errors import ConfigError, InvalidMessage

__all__ = ["CODEC_NAMES", "DenseInt8Codec", "PseudoGradCodec", "SparseLoCoCodec", "codec_for"]

CODEC_NAMES = ("int8", "sparse")
"""Names accepted by `codec_for`."""

MAGIC = b"HV"
INT8_ID = 1
SPARSE_ID = 2
INT8_VERSION = 1
SPARSE_VERSION = 2  # 1 sent plain log2(chunk_values)-bit offsets
INT8_BLOCK = 256
_INT8_HEADER = struct.Struct("<2sBB")
_SPARSE_HEADER = struct.Struct("<2sBBII")
_LEVELS = torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float32)
_LLOYD_STEPS = 3


class PseudoGradCodec(Protocol):
    """Encodes a pseudo-gradient (float32 tensors with exactly `shapes`) into bytes, and back."""

    name: str
    shapes: tuple[tuple[int, ...], ...]

    def encode(self, tensors: Sequence[torch.Tensor]) -> bytes:
        """Encode; stateful for codecs with error feedback."""
        ...

    def decode(self, payload: bytes) -> list[torch.Tensor]:
        """Decode untrusted bytes (pure, deterministic); InvalidMessage on any malformed input."""
        ...

    def max_payload_bytes(self) -> int:
        """Upper bound of the length of any valid payload for these shapes."""
        ...

    def reset(self) -> None:
        """Forget the error feedback (after a round averaged alone, or a downloaded state)."""
        ...

    def compression_ratio(self) -> float:
        """fp32 bytes of the shapes over `max_payload_bytes()`."""
        ...


def codec_for(
    name: str,
    shapes: Sequence[Sequence[int]],
    *,
    density: float = 0.015,
    chunk_values: int = 4096,
    error_feedback: bool = True,
) -> PseudoGradCodec:
    """The codec called `name` for `shapes`; ConfigError for an unknown name or a bad density/chunk.

    `density` and `chunk_values` are checked whatever the name, so a bad config fails either way.
    """
    _check_sparse_config(density, chunk_values)
    if name == "int8":
        return DenseInt8Codec(shapes)
    if name == "sparse":
        return SparseLoCoCodec(
            shapes, density=density, chunk_values=chunk_values, error_feedback=error_feedback
        )
    raise ConfigError(f"unknown pseudo-gradient codec {name!r}; choose one of {', '.join(CODEC_NAMES)}")


class _ShapedCodec:
    """What both codecs share: the shapes, flattening, unflattening."""

    name: str
    shapes: tuple[tuple[int, ...], ...]

    def __init__(self, shapes: Sequence[Sequence[int]]) -> None:
        try:
            self.shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"pseudo-gradient shapes must be sequences of integers: {e}") from None
        if any(d < 0 for shape in self.shapes for d in shape):
            raise ConfigError(f"pseudo-gradient shapes have a negative dimension: {self.shapes}")
        self._sizes = [math.prod(shape) for shape in self.shapes]
        self.numel = sum(self._sizes)

    def max_payload_bytes(self) -> int:
        raise NotImplementedError

    def compression_ratio(self) -> float:
        """fp32 bytes of the shapes over `max_payload_bytes()`."""
        return 4 * self.numel / self.max_payload_bytes()

    def _flatten(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != len(self.shapes):
            raise ValueError(f"{self.name} codec expects {len(self.shapes)} tensors, got {len(tensors)}")
        for i, (tensor, shape) in enumerate(zip(tensors, self.shapes, strict=True)):
            if tensor.dtype != torch.float32 or tuple(tensor.shape) != shape:
                raise ValueError(
                    f"tensor {i} is {tensor.dtype} {tuple(tensor.shape)}; the codec expects float32 {shape}"
                )
        if not tensors:
            return torch.zeros(0, dtype=torch.float32)
        flat = torch.cat([t.detach().cpu().reshape(-1) for t in tensors])
        if not bool(torch.isfinite(flat).all()):
            raise ValueError("the pseudo-gradient has non-finite values; refusing to encode it")
        return flat

    def _unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        if not self.shapes:
            return []
        parts = torch.split(flat, self._sizes)
        return [part.view(shape) for part, shape in zip(parts, self.shapes, strict=True)]

    def _check_header(self, data: bytes, header: struct.Struct, codec_id: int, known: int) -> tuple[int, ...]:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidMessage(f"{self.name} payload must be bytes, got {type(data).__name__}")
        if len(data) < header.size:
            raise InvalidMessage(f"{self.name} payload of {len(data)} bytes is shorter than its header")
        magic, got_id, version, *rest = header.unpack_from(data)
        if magic != MAGIC:
            raise InvalidMessage(
                f"not a pseudo-gradient payload (magic {bytes(magic)!r}, expected {MAGIC!r})"
            )
        if got_id != codec_id:
            raise InvalidMessage(f"payload is for codec id {got_id}; this {self.name} codec is id {codec_id}")
        if version != known:
            raise InvalidMessage(f"{self.name} payload has version {version}; only {known} is known")
        return tuple(rest)

    def _check_length(self, data: bytes) -> None:
        expected = self.max_payload_bytes()
        if len(data) != expected:
            raise InvalidMessage(f"{self.name} payload is {len(data)} bytes; these shapes take {expected}")


class DenseInt8Codec(_ShapedCodec):
    """Blockwise absmax int8: about 1.016 bytes per value; stateless, no error feedback."""

    name: str = "int8"

    def __init__(self, shapes: Sequence[Sequence[int]]) -> None:
        super().__init__(shapes)
        self._blocks = -(-self.numel // INT8_BLOCK)

    def max_payload_bytes(self) -> int:
        return _INT8_HEADER.size + 4 * self._blocks + self.numel

    def reset(self) -> None:
        """Nothing to forget: this codec keeps no state."""

    def encode(self, tensors: Sequence[torch.Tensor]) -> bytes:
        flat = self._flatten(tensors)
        blocks = _padded(flat, self._blocks * INT8_BLOCK).view(self._blocks, INT8_BLOCK)
        scales = blocks.abs().amax(dim=1) / 127.0
        if not bool(torch.isfinite(scales * 127.0).all()):
            raise ValueError("the pseudo-gradient has values too large for the int8 codec")
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8)
        header = _INT8_HEADER.pack(MAGIC, INT8_ID, INT8_VERSION)
        return header + _le_f32(scales).tobytes() + codes.reshape(-1)[: self.numel].numpy().tobytes()

    def decode(self, payload: bytes) -> list[torch.Tensor]:
        self._check_header(payload, _INT8_HEADER, INT8_ID, INT8_VERSION)
        self._check_length(payload)
        raw = np.frombuffer(payload, dtype=np.uint8)
        start = _INT8_HEADER.size
        scales = _scales_from(
            raw[start : start + 4 * self._blocks].reshape(self._blocks, 4), 127.0, self.name
        )
        codes = raw[start + 4 * self._blocks :].view(np.int8)
        if bool((codes == -128).any()):
            raise InvalidMessage("int8 payload has the code -128; codes must lie in [-127, 127]")
        padded = torch.zeros(self._blocks * INT8_BLOCK, dtype=torch.float32)
        padded[: self.numel] = torch.from_numpy(codes.astype(np.float32))
        values = padded.view(self._blocks, INT8_BLOCK) * scales[:, None]
        return self._unflatten(values.reshape(-1)[: self.numel])


class SparseLoCoCodec(_ShapedCodec):
    """Per-chunk top-k by |value|, 2-bit values, error feedback (`acc = ef_decay * ef + pg`)."""

    name: str = "sparse"

    def __init__(
        self,
        shapes: Sequence[Sequence[int]],
        *,
        density: float = 0.015,
        chunk_values: int = 4096,
        error_feedback: bool = True,
        ef_decay: float = 1.0,
    ) -> None:
        super().__init__(shapes)
        _check_sparse_config(density, chunk_values)
        if not 0.0 <= ef_decay <= 1.0:
            raise ConfigError(f"error-feedback decay must lie in [0, 1], got {ef_decay}")
        self.density = float(density)
        self.chunk_values = chunk_values
        self.error_feedback = error_feedback
        self.ef_decay = float(ef_decay)
        self.k_full = _kept(self.density, chunk_values)
        full, last = divmod(self.numel, chunk_values)
        # Groups of equal chunks: (offset of the first value, chunk count, chunk length, kept per chunk).
        self._groups: list[tuple[int, int, int, int]] = []
        if full:
            self._groups.append((0, full, chunk_values, self.k_full))
        if last:
            self._groups.append((full * chunk_values, 1, last, _kept(self.density, last)))
        self._ef = torch.zeros(self.numel, dtype=torch.float32)

    def max_payload_bytes(self) -> int:
        return _SPARSE_HEADER.size + sum(n * _record_bytes(length, k) for _, n, length, k in self._groups)

    def reset(self) -> None:
        self._ef.zero_()

    def encode(self, tensors: Sequence[torch.Tensor]) -> bytes:
        pg = self._flatten(tensors)
        if self.error_feedback:
            acc = (self._ef * self.ef_decay if self.ef_decay != 1.0 else self._ef) + pg
        else:
            acc = pg
        parts = [_SPARSE_HEADER.pack(MAGIC, SPARSE_ID, SPARSE_VERSION, self.chunk_values, self.k_full)]
        residual = acc  # a fresh tensor when error feedback is on; only written then
        for start, n, length, k in self._groups:
            chunks = acc[start : start + n * length].view(n, length)
            idx = _top_k_indices(chunks, k)
            scales, codes = _quantize(torch.gather(chunks, 1, idx))
            if not bool(torch.isfinite(scales * 1.5).all()):
                raise ValueError("the pseudo-gradient has values too large for the sparse codec")
            scale_bytes = _le_f32(scales).view(np.uint8).reshape(n, 4)
            index_bytes = elias_fano_encode(idx.numpy(), length)
            code_bytes = pack_bits(codes.numpy(), 2)
            parts.append(np.concatenate([scale_bytes, index_bytes, code_bytes], axis=1).tobytes())
            if self.error_feedback:
                positions = (idx + start + length * torch.arange(n)[:, None]).reshape(-1)
                residual[positions] -= _dequantize(codes.long(), scales).reshape(-1)
        if self.error_feedback:
            self._ef = residual
        return b"".join(parts)

    def decode(self, payload: bytes) -> list[torch.Tensor]:
        chunk_values, k_full = self._check_header(payload, _SPARSE_HEADER, SPARSE_ID, SPARSE_VERSION)
        if chunk_values != self.chunk_values or k_full != self.k_full:
            raise InvalidMessage(
                f"sparse payload has chunks of {chunk_values} values keeping {k_full}; this run uses "
                f"{self.chunk_values} keeping {self.k_full}"
            )
        self._check_length(payload)
        raw = np.frombuffer(payload, dtype=np.uint8)
        flat = torch.zeros(self.numel, dtype=torch.float32)
        offset = _SPARSE_HEADER.size
        for start, n, length, k in self._groups:
            record = _record_bytes(length, k)
            block = raw[offset : offset + n * record].reshape(n, record)
            offset += n * record
            index_end = 4 + elias_fano_bytes(length, k)
            scales = _scales_from(block[:, :4], 1.5, self.name)
            idx = elias_fano_decode(block[:, 4:index_end], k, length)
            codes = torch.from_numpy(unpack_bits(block[:, index_end:], k, 2))
            positions = torch.from_numpy(idx + start + length * np.arange(n, dtype=np.int64)[:, None])
            flat[positions.reshape(-1)] = _dequantize(codes, scales).reshape(-1)
        return self._unflatten(flat)


def _check_sparse_config(density: float, chunk_values: int) -> None:
    if not isinstance(density, int | float) or not 0.0 < density <= 0.5:
        raise ConfigError(f"sparse codec density must lie in (0, 0.5], got {density!r}")
    if (
        not isinstance(chunk_values, int)
        or isinstance(chunk_values, bool)
        or not 64 <= chunk_values <= 65536
        or chunk_values & (chunk_values - 1)
    ):
        raise ConfigError(
            f"sparse codec chunk_values must be a power of two in [64, 65536], got {chunk_values!r}"
        )


def _kept(density: float, length: int) -> int:
    return max(1, round(density * length))


def _record_bytes(length: int, k: int) -> int:
    """Bytes of one chunk of `length` values keeping k: scale, Elias-Fano indices, 2-bit codes."""
    return 4 + elias_fano_bytes(length, k) + -(-k // 4)


def _padded(flat: torch.Tensor, size: int) -> torch.Tensor:
    if flat.numel() == size:
        return flat
    out = torch.zeros(size, dtype=torch.float32)
    out[: flat.numel()] = flat
    return out


def _le_f32(values: torch.Tensor) -> npt.NDArray[np.float32]:
    return np.ascontiguousarray(values.numpy(), dtype="<f4")


def _scales_from(raw: npt.NDArray[np.uint8], top_level: float, name: str) -> torch.Tensor:
    """Float32 scales from [n, 4] little-endian bytes; each finite, non-negative, top_level * s finite."""
    scales = torch.from_numpy(np.ascontiguousarray(raw).view("<f4").reshape(-1).astype(np.float32))
    bad = ~torch.isfinite(scales * top_level) | torch.signbit(scales)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise InvalidMessage(
            f"{name} payload has scale {float(scales[first])} (block {first}); scales must be finite, "
            f"non-negative and at most float32 max / {top_level}"
        )
    return scales


def _top_k_indices(chunks: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending offsets of each row's k largest |values|, ties going to the lowest offsets."""
    mag = chunks.abs()
    kth = torch.topk(mag, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = mag > kth
    ties = mag == kth
    need = k - above.sum(dim=1, keepdim=True)
    keep = above | (ties & (ties.cumsum(dim=1) <= need))
    return keep.nonzero()[:, 1].view(chunks.shape[0], k)


def _quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale per row, 2-bit code per value): nearest of ±0.5s, ±1.5s, s fitted by Lloyd steps."""
    mag = values.abs().double()
    s = 2.0 * mag.mean(dim=1)
    for _ in range(_LLOYD_STEPS):
        level = torch.where(mag >= s[:, None], 1.5, 0.5)
        s = (mag * level).sum(dim=1) / (level * level).sum(dim=1)
    scales = s.float()
    outer = (values.abs() >= scales[:, None]).to(torch.uint8)
    codes = torch.where(values >= 0, 2 + outer, 1 - outer)
    return scales, codes


def _dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """level * scale in float32, elementwise: the one arithmetic of decode and of the error feedback."""
    return _LEVELS[codes] * scales[:, None]
