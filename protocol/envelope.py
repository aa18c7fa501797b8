"""Signed envelopes: every application message hivenet signs travels in one.

The signature covers the domain (what kind of message), the protocol version, the run id,
the DHT key (if any), an expiry and a sequence number, so a signed message cannot be
replayed in another context. The signer is a PeerID with the public key inlined, so a
receiver verifies with no lookup.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import hivenet_pb2 as pb
from protocol.errors import ExpiredMessage, InvalidMessage
from protocol.limits import MAX_CLOCK_SKEW_S, MAX_ENVELOPE_BYTES
from protocol.peer_keys import Signer, peer_id_from_private_key, signature_verifies
from protocol.untrusted import capped_bytes, parse_untrusted
from protocol.version import PROTOCOL_VERSION

SIGNATURE_CONTEXT = b"hivenet-envelope-v1\x00"
"""Prefixed to the body before signing so these signatures are never valid for another protocol."""


@dataclass(frozen=True)
class Envelope:
    """A verified envelope: the signer really signed all of these fields."""

    domain: str
    protocol_version: int
    run_id: str
    dht_key: str
    expires_at: float
    seq: int
    signer: bytes
    payload: bytes
    sealed: bytes = field(default=b"", repr=False, compare=False)
    """The serialized envelope as received (what a receiver relays or stores to prove it later)."""


def seal(
    private_key: Ed25519PrivateKey | Signer,
    *,
    domain: str,
    run_id: str,
    payload: bytes,
    expires_at: float,
    seq: int,
    dht_key: str = "",
    max_bytes: int = MAX_ENVELOPE_BYTES,
) -> bytes:
    """Sign `payload` in context and return the serialized SignedEnvelope (at most `max_bytes`).

    A `Signer` (the key with its PeerID derived once) makes the same envelope faster, for callers
    that seal many."""
    signer = private_key.peer_id if isinstance(private_key, Signer) else peer_id_from_private_key(private_key)
    body = pb.EnvelopeBody(
        domain=domain,
        protocol_version=PROTOCOL_VERSION,
        run_id=run_id,
        dht_key=dht_key,
        expires_at=expires_at,
        seq=seq,
        signer=signer,
        payload=payload,
    ).SerializeToString()
    signature = private_key.sign(SIGNATURE_CONTEXT + body)
    data = pb.SignedEnvelope(body=body, signature=signature).SerializeToString()
    if len(data) > max_bytes:
        raise InvalidMessage(f"envelope of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    return data


def parse_envelope(
    data: object, max_bytes: int = MAX_ENVELOPE_BYTES, what: str = "envelope"
) -> tuple[pb.SignedEnvelope, pb.EnvelopeBody]:
    """Decode an untrusted envelope and its body, unverified (size-capped; InvalidMessage if malformed).

    Only for choosing how to verify it (`peek_domain`) or for verifying it next with `open_parsed`.
    """
    data = capped_bytes(data, max_bytes, what)
    envelope = parse_untrusted(pb.SignedEnvelope, data, what)
    return envelope, parse_untrusted(pb.EnvelopeBody, envelope.body, f"{what} body")


def peek_domain(data: object) -> str:
    """The domain an untrusted envelope claims, unverified: only for choosing how to verify it."""
    return parse_envelope(data)[1].domain


def open_envelope(
    data: object,
    *,
    domain: str,
    run_id: str | None = None,
    dht_key: str | None = None,
    signer: bytes | None = None,
    max_ttl_s: float | None = None,
    now: float | None = None,
    max_bytes: int = MAX_ENVELOPE_BYTES,
) -> Envelope:
    """Verify an untrusted serialized envelope and return its contents.

    Raises InvalidMessage if it is not bytes, larger than `max_bytes` (the DHT value limit
    unless the caller's domain allows more), malformed, of another domain,
    protocol version, run or DHT key, signed by someone other than `signer`, badly
    signed, expired, or valid for longer than `max_ttl_s`.
    """
    envelope, body = parse_envelope(data, max_bytes)
    return open_parsed(
        envelope,
        body,
        domain=domain,
        run_id=run_id,
        dht_key=dht_key,
        signer=signer,
        max_ttl_s=max_ttl_s,
        now=now,
    )


def open_parsed(
    envelope: pb.SignedEnvelope,
    body: pb.EnvelopeBody,
    *,
    domain: str,
    run_id: str | None = None,
    dht_key: str | None = None,
    signer: bytes | None = None,
    max_ttl_s: float | None = None,
    now: float | None = None,
) -> Envelope:
    """`open_envelope` for an envelope already decoded by `parse_envelope` (checks and signature)."""
    if body.domain != domain:
        raise InvalidMessage(f"envelope is a {body.domain!r} message, expected {domain!r}")
    if body.protocol_version != PROTOCOL_VERSION:
        raise InvalidMessage(
            f"envelope uses protocol v{body.protocol_version}, this node speaks v{PROTOCOL_VERSION}"
        )
    if run_id is not None and body.run_id != run_id:
        raise InvalidMessage(f"envelope belongs to run {body.run_id!r}, expected {run_id!r}")
    if dht_key is not None and body.dht_key != dht_key:
        raise InvalidMessage("envelope was signed for another DHT key")
    if signer is not None and body.signer != signer:
        raise InvalidMessage("envelope is signed by another peer than the one it claims to describe")

    if not signature_verifies(body.signer, envelope.signature, SIGNATURE_CONTEXT + envelope.body):
        raise InvalidMessage("envelope signature does not verify")

    now = time.time() if now is None else now
    # written as `not (in range)` so that a NaN expiry, for which every comparison is False, is refused
    if not body.expires_at >= now - MAX_CLOCK_SKEW_S:
        raise ExpiredMessage("envelope has expired")
    if max_ttl_s is not None and not body.expires_at <= now + max_ttl_s + MAX_CLOCK_SKEW_S:
        raise InvalidMessage(f"envelope claims validity beyond the {max_ttl_s:.0f} s maximum")
    return Envelope(
        domain=body.domain,
        protocol_version=body.protocol_version,
        run_id=body.run_id,
        dht_key=body.dht_key,
        expires_at=body.expires_at,
        seq=body.seq,
        signer=body.signer,
        payload=body.payload,
        sealed=envelope.SerializeToString(),
    )
