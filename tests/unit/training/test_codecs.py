"""Pseudo-gradient codecs: round trips, determinism, hivemind registration, malformed input."""

from __future__ import annotations

import math

import pytest
import torch
from hivemind.compression import CompressionInfo, deserialize_torch_tensor

from node.averaging.codecs import (
    CODEC_NAMES,
    Int8BlockCodec,
    codec_for,
    decode_tensor,
    install_hivemind_codecs,
)
from protocol.errors import ConfigError, InvalidMessage


def _encode(name: str, tensor: torch.Tensor):
    return codec_for(name).compress(tensor, CompressionInfo.from_tensor(tensor))


@pytest.mark.parametrize("shape", [(1,), (7,), (256,), (1000,), (3, 5, 17)])
def test_round_trips_within_codec_error(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 0.01
    assert torch.equal(decode_tensor(_encode("fp32", x)), x)
    fp16 = decode_tensor(_encode("fp16", x))
    assert fp16.shape == x.shape and torch.allclose(fp16, x, rtol=1e-3, atol=1e-7)
    int8 = decode_tensor(_encode("int8", x))
    assert int8.shape == x.shape
    # Blockwise absmax: the error of a value is at most half a step of its block's scale.
    blocks = math.ceil(x.numel() / 256)
    flat = torch.zeros(blocks * 256)
    flat[: x.numel()] = x.reshape(-1)
    step = flat.view(blocks, 256).abs().amax(1) / 127
    err = torch.zeros(blocks * 256)
    err[: x.numel()] = (int8 - x).abs().reshape(-1)
    assert bool((err.view(blocks, 256) <= step[:, None] * 0.5 + 1e-9).all())


def test_int8_is_about_one_byte_per_value_and_deterministic() -> None:
    x = torch.randn(10_000)
    a, b = _encode("int8", x), _encode("int8", x.clone())
    assert a.SerializeToString() == b.SerializeToString()
    assert len(a.buffer) == 10_000 + 4 * math.ceil(10_000 / 256)
    assert torch.equal(decode_tensor(a), decode_tensor(b))


def test_zeros_and_non_finite_values() -> None:
    assert torch.equal(decode_tensor(_encode("int8", torch.zeros(300))), torch.zeros(300))
    x = torch.ones(300)
    x[5] = float("nan")
    assert not bool(torch.isfinite(decode_tensor(_encode("int8", x))).all())
    x = torch.ones(10)
    x[0] = float("inf")
    assert not bool(torch.isfinite(decode_tensor(_encode("fp32", x))).all())


def test_hivemind_decodes_our_int8_after_install() -> None:
    install_hivemind_codecs()
    x = torch.randn(777)
    assert torch.equal(deserialize_torch_tensor(_encode("int8", x)), decode_tensor(_encode("int8", x)))


def test_malformed_messages_are_refused() -> None:
    message = _encode("int8", torch.randn(100))
    message.buffer = message.buffer[:-1]
    with pytest.raises(InvalidMessage):
        decode_tensor(message)
    message = _encode("fp16", torch.randn(100))
    message.size[:] = [1000]
    with pytest.raises(InvalidMessage):
        decode_tensor(message)
    message = _encode("fp32", torch.randn(4))
    message.compression = 3  # QUANTILE_8BIT: not one of ours
    with pytest.raises(InvalidMessage):
        decode_tensor(message)


def test_unknown_codec_name() -> None:
    assert set(CODEC_NAMES) == {"fp32", "fp16", "int8"}
    with pytest.raises(ConfigError):
        codec_for("int4")
    with pytest.raises(ConfigError):
        Int8BlockCodec(block_values=0)
