"""Address attestations: a seed's signed word that a PeerID was reached at some addresses.

A node record or a holder announcement lists addresses that its signer merely claims; anyone may
name a third party's host. When a seed's dial-back probe (`node.reachability`) reaches a requester,
libp2p has authenticated the requester's PeerID at the address the probe dialled, an address the
seed built itself from the IP the request came from. The seed then seals an `AddressAttestation`
(subject PeerID, the exact addresses the probe reached, issue time) in an envelope of domain
`ATTESTATION_DOMAIN` that expires after `ATTESTATION_TTL_S`. The node publishes the attestations
it holds in its record (and holder announcements); a peer dials an address of a record, in a public
swarm, only if an attestation by one of its own seeds names it (`node.broadcast.dialing`).

`open_attestation` verifies one strictly: size cap, envelope domain, protocol version, no run id,
signature, expiry and validity window, signer allowed, a subject that is an Ed25519 PeerID other
than the signer (and the expected one), 1-`MAX_ATTESTED_ADDRESSES` canonical plain TCP addresses.
`check_attestation_list` only caps the count and sizes of the sealed attestations a record carries:
a record stays valid when one expires, and whoever would dial verifies them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from multiaddr import Multiaddr

from protocol import hivenet_pb2 as pb
from protocol.envelope import open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.limits import MAX_ATTESTATION_BYTES, MAX_ATTESTATIONS, MAX_CLOCK_SKEW_S
from protocol.peer_keys import Signer, check_ed25519_peer_id
from protocol.untrusted import parse_untrusted

ATTESTATION_DOMAIN = "address-attestation"

ATTESTATION_TTL_S = 3600.0
"""Validity of an attestation. An hour is long enough that a node renews it rarely (every quarter
hour, `node.attestations.RENEW_INTERVAL_S`, so three renewals can fail before it lapses, and a
seed, which probes each source IP once per cooldown, sees one probe per node that often) and short
enough that an address a node gave up (a dynamic IP handed to someone else, a closed port) stops
being dialled on its word within the hour."""

MAX_ATTESTED_ADDRESSES = 4
"""Most addresses one attestation names (a probe connects at one; the dialler dials a few at most)."""

_ADDRESS_SHAPES = (["ip4", "tcp"], ["ip6", "tcp"])


@dataclass(frozen=True)
class AddressAttestation:
    """A verified attestation: `signer` reached `subject` at `addresses` at `issued_at`."""

    signer: bytes
    subject: bytes
    addresses: tuple[str, ...]
    issued_at: float
    expires_at: float
    sealed: bytes = field(default=b"", repr=False, compare=False)


def attested_address(address: str) -> str:
    """`address` if it is a canonical `/ip4|ip6/<ip>/tcp/<port>` multiaddr (the only kind a probe
    dials); InvalidMessage otherwise."""
    if not isinstance(address, str) or len(address) > 64:
        raise InvalidMessage("attested address must be a short string")
    try:
        maddr = Multiaddr(address)
        names = [proto.name for proto in maddr.protocols()]
        canonical = str(maddr)
    except Exception:
        raise InvalidMessage(f"attested address {address[:64]!r} is not a multiaddr") from None
    if names not in _ADDRESS_SHAPES or canonical != address:
        raise InvalidMessage(
            f"attested address {address[:64]!r} is not a canonical /ip4|ip6/../tcp/.. address"
        )
    return address


def seal_attestation(
    key: Ed25519PrivateKey | Signer,
    *,
    subject: bytes,
    addresses: Sequence[str],
    issued_at: float | None = None,
    ttl_s: float = ATTESTATION_TTL_S,
) -> bytes:
    """The sealed attestation, by `key`'s owner, that `subject` was reached at `addresses`."""
    issued_at = time.time() if issued_at is None else issued_at
    check_ed25519_peer_id(subject)
    if not 0 < len(addresses) <= MAX_ATTESTED_ADDRESSES:
        raise InvalidMessage(f"an attestation names 1-{MAX_ATTESTED_ADDRESSES} addresses")
    payload = pb.AddressAttestation(
        subject=subject, addresses=[attested_address(a) for a in addresses], issued_at=issued_at
    ).SerializeToString()
    return seal(
        key,
        domain=ATTESTATION_DOMAIN,
        run_id="",
        payload=payload,
        expires_at=issued_at + ttl_s,
        seq=int(issued_at * 1000),
        max_bytes=MAX_ATTESTATION_BYTES,
    )


def open_attestation(
    data: object,
    *,
    subject: bytes | None = None,
    signers: Collection[bytes] | None = None,
    now: float | None = None,
) -> AddressAttestation:
    """Verify an untrusted sealed attestation (of `subject`, by one of `signers`, if given).

    Raises InvalidMessage if it is not bytes, over `MAX_ATTESTATION_BYTES`, malformed, of another
    domain or protocol version, bound to a run, badly signed, signed by none of `signers`, expired,
    valid for longer than `ATTESTATION_TTL_S`, issued in the future, about another subject or its
    own signer, or names no, too many, or other than canonical plain TCP addresses.
    """
    now = time.time() if now is None else now
    envelope = open_envelope(
        data,
        domain=ATTESTATION_DOMAIN,
        run_id="",
        max_ttl_s=ATTESTATION_TTL_S,
        now=now,
        max_bytes=MAX_ATTESTATION_BYTES,
    )
    if signers is not None and envelope.signer not in signers:
        raise InvalidMessage("attestation is signed by a peer not trusted to attest addresses")
    message = parse_untrusted(pb.AddressAttestation, envelope.payload, "address attestation")
    check_ed25519_peer_id(message.subject)
    if subject is not None and message.subject != subject:
        raise InvalidMessage("attestation is about another peer")
    if message.subject == envelope.signer:
        raise InvalidMessage("attestation is signed by its own subject")
    issued_at = message.issued_at
    if not (
        math.isfinite(issued_at) and issued_at <= now + MAX_CLOCK_SKEW_S and issued_at <= envelope.expires_at
    ):
        raise InvalidMessage("attestation has an impossible issue time")
    if not 0 < len(message.addresses) <= MAX_ATTESTED_ADDRESSES:
        raise InvalidMessage(f"an attestation names 1-{MAX_ATTESTED_ADDRESSES} addresses")
    return AddressAttestation(
        signer=envelope.signer,
        subject=message.subject,
        addresses=tuple(attested_address(a) for a in message.addresses),
        issued_at=issued_at,
        expires_at=envelope.expires_at,
        sealed=envelope.sealed if not isinstance(data, bytes) else data,
    )


def check_attestation_list(values: Sequence[bytes], what: str) -> tuple[bytes, ...]:
    """`values` as a tuple if there are at most `MAX_ATTESTATIONS`, each bytes of at most
    `MAX_ATTESTATION_BYTES` (unverified: see the module docstring); InvalidMessage otherwise."""
    if len(values) > MAX_ATTESTATIONS:
        raise InvalidMessage(f"{what} carries more than {MAX_ATTESTATIONS} address attestations")
    for value in values:
        if not isinstance(value, bytes) or len(value) > MAX_ATTESTATION_BYTES:
            raise InvalidMessage(f"{what} carries an oversized address attestation")
    return tuple(values)
