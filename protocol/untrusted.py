"""Parsing bytes that came from the network: size-capped first, then decoded, or InvalidMessage.

Every protobuf that arrives from a peer (DHT records, envelopes, manifests, stream frames) goes
through `parse_untrusted`, so that a malformed message always becomes one `InvalidMessage` with
a reason, never a protobuf exception escaping into a handler.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from protocol.errors import InvalidMessage

__all__ = ["capped_bytes", "parse_untrusted"]

M = TypeVar("M", bound=Message)


def capped_bytes(data: object, limit: int, what: str) -> bytes:
    """`data` itself if it is `bytes` of at most `limit` bytes; InvalidMessage naming `what` otherwise."""
    if not isinstance(data, bytes):
        raise InvalidMessage(f"{what} must be bytes, got {type(data).__name__}")
    if len(data) > limit:
        raise InvalidMessage(f"{what} of {len(data)} bytes exceeds the {limit}-byte limit")
    return data


def parse_untrusted(message_type: type[M], data: bytes, what: str) -> M:
    """Decode `data` (already size-capped) as `message_type`; InvalidMessage naming `what` if malformed."""
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidMessage(f"malformed {what}: {exc}") from None
    return message
