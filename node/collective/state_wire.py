"""Wire format of the outer-state service (`node.collective.state_service`), with its strict parsers.

One stream carries one exchange. Every frame is a `node.broadcast.wire` frame (a 4-byte big-endian
length, then that many bytes), its length checked against a cap before the body is read.

* **Request** (client to server, one frame of exactly `REQUEST_BYTES`, read under a cap of
  `MAX_REQUEST_BYTES`): `MAGIC`, a kind byte (`OFFER`: the header only; `DOWNLOAD`: the header
  and the payload), then `newer_than` (signed 64-bit big-endian): the client wants an outer step
  above it. Any other content is malformed (its sender is banned).
* **Header** (server to client, one frame, read under a cap of `MAX_HEADER_BYTES`): `MAGIC`, a
  status byte, then for `STATUS_OK` exactly: step (unsigned 64-bit), the state hash (the 8 bytes
  whose hex form is `state_hash`'s 16 digits) and the payload's size in bytes (unsigned 64-bit;
  sent for an offer too, where no payload follows); for `STATUS_ERROR`: a UTF-8 error text.
* **Payload** (download only, raw, after an OK header): float32 little-endian values of every
  parameter, then of every momentum buffer, in order; exactly `payload_bytes(shapes)` bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from node.collective.outer_state import OuterState, state_hash
from protocol.errors import InvalidMessage

__all__ = [
    "DOWNLOAD",
    "MAX_ERROR_CHARS",
    "MAX_HEADER_BYTES",
    "MAX_REQUEST_BYTES",
    "OFFER",
    "Header",
    "Request",
    "SerializedState",
    "clip",
    "decode_state",
    "encode_error",
    "encode_header",
    "encode_request",
    "parse_header",
    "parse_request",
    "payload_bytes",
    "serialize_state",
]

MAGIC = b"HNS1"
OFFER, DOWNLOAD = 1, 2
STATUS_OK, STATUS_ERROR = 0, 1

_REQUEST = struct.Struct(">4sBq")
_HEADER_OK = struct.Struct(">4sBQ8sQ")
_HEADER_PREFIX = struct.Struct(">4sB")
REQUEST_BYTES = _REQUEST.size
MAX_REQUEST_BYTES = 256
"""Cap on a request frame; a longer one is refused after reading its length and its sender banned."""
MAX_ERROR_CHARS = 200
MAX_HEADER_BYTES = _HEADER_PREFIX.size + 4 * MAX_ERROR_CHARS
_DTYPE = np.dtype("<f4")


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` cut to `limit` characters (error texts on the wire, peer-controlled strings in logs)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Request:
    kind: int
    """`OFFER` or `DOWNLOAD`."""
    newer_than: int
    """The client wants an outer step above this."""


def encode_request(kind: int, newer_than: int) -> bytes:
    return _REQUEST.pack(MAGIC, kind, newer_than)


def parse_request(frame: bytes) -> Request:
    """The request in `frame`; InvalidMessage if it is anything but a well-formed request."""
    if len(frame) != REQUEST_BYTES:
        raise InvalidMessage(f"state request of {len(frame)} bytes instead of {REQUEST_BYTES}")
    magic, kind, newer_than = _REQUEST.unpack(frame)
    if magic != MAGIC or kind not in (OFFER, DOWNLOAD):
        raise InvalidMessage(f"malformed state request (magic {magic!r}, kind {kind})")
    return Request(kind, newer_than)


@dataclass(frozen=True)
class Header:
    """A server's answer: a state's (step, hash, payload size), or an error text (untrusted, clipped)."""

    step: int = 0
    hash: str = ""
    payload_bytes: int = 0
    error: str = ""


def encode_header(step: int, digest: str, size: int) -> bytes:
    return _HEADER_OK.pack(MAGIC, STATUS_OK, step, bytes.fromhex(digest), size)


def encode_error(error: str) -> bytes:
    return _HEADER_PREFIX.pack(MAGIC, STATUS_ERROR) + clip(error).encode()


def parse_header(frame: bytes) -> Header:
    """The header in `frame`; InvalidMessage if it is malformed."""
    if len(frame) < _HEADER_PREFIX.size:
        raise InvalidMessage(f"state header of {len(frame)} bytes")
    magic, status = _HEADER_PREFIX.unpack_from(frame)
    if magic != MAGIC:
        raise InvalidMessage(f"state header with magic {magic!r}")
    if status == STATUS_ERROR:
        text = frame[_HEADER_PREFIX.size :].decode(errors="replace")
        return Header(error=clip(text) or "unspecified error")
    if status != STATUS_OK or len(frame) != _HEADER_OK.size:
        raise InvalidMessage(f"malformed state header (status {status}, {len(frame)} bytes)")
    _, _, step, digest, size = _HEADER_OK.unpack(frame)
    return Header(step=step, hash=digest.hex(), payload_bytes=size)


def payload_bytes(shapes: Sequence[Sequence[int]]) -> int:
    """The exact payload size of a state of these parameter shapes (params and momentum)."""
    return 2 * _DTYPE.itemsize * sum(math.prod(shape) for shape in shapes)


@dataclass(frozen=True)
class SerializedState:
    """A state as served: its header fields and its payload, computed once and shared by every upload."""

    step: int
    hash: str
    payload: memoryview


def serialize_state(state: OuterState, shapes: Sequence[Sequence[int]]) -> SerializedState:
    """`state` in wire form (CPU-bound: run it off the event loop); ValueError if it has other shapes."""
    tensors = [*state.params, *state.momentum]
    expected = [tuple(shape) for shape in shapes] * 2
    if len(state.params) != len(shapes) or [tuple(t.shape) for t in tensors] != expected:
        raise ValueError("the outer state's shapes are not the ones this service serves")
    flat = [t.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1) for t in tensors]
    out = np.empty(sum(t.numel() for t in flat), dtype=_DTYPE)
    offset = 0
    for tensor in flat:
        out[offset : offset + tensor.numel()] = tensor.numpy()
        offset += tensor.numel()
    n = len(shapes)
    return SerializedState(state.step, state_hash(flat[:n], flat[n:]), out.data.cast("B"))


def decode_state(payload: bytearray, shapes: Sequence[Sequence[int]], step: int, digest: str) -> OuterState:
    """The state in a downloaded `payload` (CPU-bound: run it off the event loop), fully verified:
    its size, finite values, and `state_hash` equal to the advertised `digest`; else InvalidMessage."""
    if len(payload) != payload_bytes(shapes):
        raise InvalidMessage(f"a payload of {len(payload)} bytes instead of {payload_bytes(shapes)}")
    values = np.frombuffer(payload, dtype=_DTYPE)  # a bytearray: writable, so torch shares it
    if not bool(np.isfinite(values).all()):
        raise InvalidMessage("the state holds non-finite values")
    tensors, offset = [], 0
    for shape in [tuple(s) for s in shapes] * 2:
        size = math.prod(shape)
        tensors.append(torch.from_numpy(values[offset : offset + size].reshape(shape)))
        offset += size
    n = len(shapes)
    recomputed = state_hash(tensors[:n], tensors[n:])
    if recomputed != digest:
        raise InvalidMessage(f"its tensors hash to {recomputed}, not to the advertised {digest}")
    return OuterState(tensors[:n], tensors[n:], step)
