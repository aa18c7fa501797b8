"""Wire codecs for pseudo-gradients: fp32, fp16 and blockwise int8, as hivemind compression objects.

hivemind's own 8-bit codecs (`Uniform8BitQuantization`, `Quantile8BitQuantization`) fail to
decode with numpy 2.x (`int()` of a one-element array), and `BlockwiseQuantization` needs
bitsandbytes. `Int8BlockCodec` replaces them on our code path: every block of
`block_values` values is scaled by its own absolute maximum to int8, with one float32
scale per block. It encodes and decodes deterministically, so a reducer that encodes an
average once and every peer that decodes it hold bit-identical tensors.

`codec_for(name)` maps a config name (`"fp32"`, `"fp16"`, `"int8"`) to a codec;
`decode_tensor(message)` decodes any message one of our codecs produced. The int8 codec
uses hivemind's `BLOCKWISE_8BIT` wire tag; `install_hivemind_codecs()` registers it in
hivemind's table so that `hivemind.compression.deserialize_torch_tensor` decodes it too.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hivemind.compression import CompressionBase, CompressionInfo, Float16Compression, NoCompression
from hivemind.proto import runtime_pb2

from protocol.errors import ConfigError, InvalidMessage

__all__ = [
    "CODEC_NAMES",
    "Int8BlockCodec",
    "codec_for",
    "decode_tensor",
    "install_hivemind_codecs",
]

CODEC_NAMES = ("fp32", "fp16", "int8")
"""Names accepted by `codec_for` (and by the trainer config's `compression` field)."""

_MAX_DIMS = 8


class Int8BlockCodec(CompressionBase):
    """Blockwise absmax int8 quantization: ~1.02 bytes per value with the default 256-value blocks.

    Layout of `buffer`: `num_blocks` float32 scales, then one int8 per value. Each value is
    `round(x / scale)` with `scale = absmax(block) / 127`; decoding multiplies back. The
    relative error per value is at most `0.5 / 127` of its block's absolute maximum.
    """

    compression_type = runtime_pb2.CompressionType.BLOCKWISE_8BIT

    def __init__(self, block_values: int = 256) -> None:
        if block_values < 1:
            raise ConfigError(f"int8 block size must be positive, got {block_values}")
        self.block_values = block_values

    def compress(
        self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False
    ) -> runtime_pb2.Tensor:
        if not torch.is_floating_point(tensor):
            raise ValueError(f"{type(self).__name__} encodes floating-point tensors, got {tensor.dtype}")
        flat = tensor.detach().to(torch.float32).reshape(-1)
        numel = flat.numel()
        num_blocks = max(1, math.ceil(numel / self.block_values))
        padded = torch.zeros(num_blocks * self.block_values, dtype=torch.float32)
        padded[:numel] = flat
        blocks = padded.view(num_blocks, self.block_values)
        absmax = blocks.abs().amax(dim=1)
        # Non-finite inputs stay non-finite in the scale, so the receiver sees (and refuses) them.
        scales = absmax / 127.0
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(blocks / safe[:, None]).clamp_(-127, 127).nan_to_num_(0.0).to(torch.int8)
        buffer = scales.numpy().astype("<f4").tobytes() + codes.reshape(-1)[:numel].numpy().tobytes()
        return runtime_pb2.Tensor(
            compression=self.compression_type,
            buffer=buffer,
            size=list(tensor.shape),
            dtype="float32",
            requires_grad=False,
        )

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        shape = _checked_shape(serialized_tensor)
        numel = math.prod(shape)
        num_blocks = max(1, math.ceil(numel / self.block_values))
        expected = 4 * num_blocks + numel
        if len(serialized_tensor.buffer) != expected:
            raise InvalidMessage(
                f"int8 tensor of shape {shape} should be {expected} bytes, got {len(serialized_tensor.buffer)}"
            )
        scales = torch.from_numpy(
            np.frombuffer(serialized_tensor.buffer, dtype="<f4", count=num_blocks).copy()
        )
        codes = np.frombuffer(serialized_tensor.buffer, dtype=np.int8, offset=4 * num_blocks, count=numel)
        padded = torch.zeros(num_blocks * self.block_values, dtype=torch.float32)
        padded[:numel] = torch.from_numpy(codes.astype(np.float32))
        values = padded.view(num_blocks, self.block_values) * scales[:, None]
        return values.reshape(-1)[:numel].reshape(shape)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return (1.0 + 4.0 / self.block_values) / 4.0


def _checked_shape(message: runtime_pb2.Tensor) -> tuple[int, ...]:
    shape = tuple(int(d) for d in message.size)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise InvalidMessage(f"tensor message has an invalid shape {shape}")
    return shape


_INT8 = Int8BlockCodec()
_CODECS: dict[str, CompressionBase] = {"fp32": NoCompression(), "fp16": Float16Compression(), "int8": _INT8}
_BY_WIRE_TAG: dict[int, CompressionBase] = {codec.compression_type: codec for codec in _CODECS.values()}


def codec_for(name: str) -> CompressionBase:
    """The codec for a config name: `fp32` (lossless), `fp16` or `int8` (blockwise absmax)."""
    try:
        return _CODECS[name]
    except KeyError:
        raise ConfigError(f"unknown compression {name!r}; choose one of {', '.join(CODEC_NAMES)}") from None


def decode_tensor(message: runtime_pb2.Tensor) -> torch.Tensor:
    """Decode a tensor sent by one of our codecs into float32; raise InvalidMessage if it is malformed."""
    codec = _BY_WIRE_TAG.get(message.compression)
    if codec is None:
        raise InvalidMessage(
            f"tensor uses compression tag {message.compression}, which hivenet does not accept"
        )
    shape = _checked_shape(message)
    if codec is not _INT8:
        if message.dtype != "float32":
            raise InvalidMessage(f"tensor message has dtype {message.dtype!r}; expected float32")
        wire_bytes = 2 if codec is _CODECS["fp16"] else 4
        if len(message.buffer) != wire_bytes * math.prod(shape):
            raise InvalidMessage(f"tensor of shape {shape} has a {len(message.buffer)}-byte buffer")
    try:
        return codec.extract(message).to(torch.float32)
    except (ValueError, RuntimeError) as e:
        raise InvalidMessage(f"could not decode a tensor message: {e}") from None


def install_hivemind_codecs() -> None:
    """Make hivemind's `deserialize_torch_tensor` decode our int8 codec (its BLOCKWISE_8BIT slot).

    The stock entry needs bitsandbytes, which hivenet does not install, so nothing is lost.
    """
    from hivemind.compression import serialization

    serialization._BASE_COMPRESSION_TYPES["BLOCKWISE_8BIT"] = _INT8
