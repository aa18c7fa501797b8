"""Address attestations (#30 item 6): a seed's signed word that a PeerID was reached at some
addresses is believed only as sealed, by the expected signer, about the expected subject, unexpired,
small, and naming a few plain TCP addresses; records and announcements carry a capped few."""

from __future__ import annotations

import time

import pytest

from protocol import broadcast_pb2 as bpb
from protocol import hivenet_pb2 as pb
from protocol.address_attestation import (
    ATTESTATION_DOMAIN,
    ATTESTATION_TTL_S,
    MAX_ATTESTATION_BYTES,
    MAX_ATTESTATIONS,
    open_attestation,
    seal_attestation,
)
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.manifest import HolderAnnouncement
from protocol.node_record import NODE_RECORD_DOMAIN, NodeRecord
from tests.helpers.members import live_member
from tests.helpers.receipts import new_peer

NOW = 1_800_000_000.0
SEED_KEY, SEED = new_peer()
OTHER_KEY, OTHER = new_peer()
_, NODE = new_peer()
ADDRESS = "/ip4/203.0.113.7/tcp/31337"


def _attest(**overrides: object) -> bytes:
    fields: dict[str, object] = {"subject": NODE, "addresses": [ADDRESS], "issued_at": NOW}
    fields.update(overrides)
    return seal_attestation(SEED_KEY, **fields)  # type: ignore[arg-type]


def _raw(payload: pb.AddressAttestation, *, key: object = SEED_KEY, **envelope: object) -> bytes:
    """An attestation sealed by hand, around `payload` (what `seal_attestation` would refuse to make)."""
    fields: dict[str, object] = {
        "domain": ATTESTATION_DOMAIN,
        "run_id": "",
        "expires_at": NOW + 60,
        "seq": 1,
    }
    fields.update(envelope)
    return seal(key, payload=payload.SerializeToString(), **fields)  # type: ignore[arg-type]


def test_a_sealed_attestation_opens_with_its_signer_subject_addresses_and_expiry() -> None:
    sealed = _attest(addresses=[ADDRESS, "/ip6/2001:db8::1/tcp/4001"])
    opened = open_attestation(sealed, subject=NODE, signers={SEED}, now=NOW + 10)
    assert (opened.signer, opened.subject) == (SEED, NODE)
    assert opened.addresses == (ADDRESS, "/ip6/2001:db8::1/tcp/4001")
    assert (opened.issued_at, opened.expires_at) == (NOW, NOW + ATTESTATION_TTL_S)
    assert opened.sealed == sealed


def test_the_largest_attestation_fits_its_cap() -> None:
    longest = "/ip6/ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/tcp/65535"
    assert len(_attest(addresses=[longest] * 4)) <= MAX_ATTESTATION_BYTES


def _forged_signature() -> bytes:
    envelope = pb.SignedEnvelope.FromString(_attest())
    body = pb.EnvelopeBody.FromString(envelope.body)
    payload = pb.AddressAttestation.FromString(body.payload)
    payload.addresses[:] = ["/ip4/198.51.100.1/tcp/22"]  # aimed at a third party, signature kept
    body.payload = payload.SerializeToString()
    return pb.SignedEnvelope(body=body.SerializeToString(), signature=envelope.signature).SerializeToString()


def _payload(**fields: object) -> pb.AddressAttestation:
    values: dict[str, object] = {"subject": NODE, "addresses": [ADDRESS], "issued_at": NOW}
    values.update(fields)
    return pb.AddressAttestation(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_forged_signature, "signature does not verify"),
        (lambda: _attest(subject=OTHER), "about another peer"),
        (lambda: _attest(issued_at=NOW - ATTESTATION_TTL_S - 120), "expired"),
        (lambda: _attest(ttl_s=ATTESTATION_TTL_S * 24), "beyond"),
        (lambda: _attest(issued_at=NOW + 600, ttl_s=60), "impossible issue time"),
        (
            lambda: seal_attestation(OTHER_KEY, subject=NODE, addresses=[ADDRESS], issued_at=NOW),
            "not trusted",
        ),
        (
            lambda: seal_attestation(SEED_KEY, subject=SEED, addresses=[ADDRESS], issued_at=NOW),
            "another peer",
        ),
        (lambda: _attest() + bytes(MAX_ATTESTATION_BYTES), "exceeds"),
        (lambda: b"\xff" * 40, "malformed"),
        (lambda: "not bytes", "must be bytes"),
        (lambda: _raw(_payload(), domain=NODE_RECORD_DOMAIN), "expected 'address-attestation'"),
        (lambda: _raw(_payload(), run_id="some-run"), "belongs to run"),
        (lambda: _raw(_payload(addresses=[])), "1-4 addresses"),
        (lambda: _raw(_payload(addresses=[ADDRESS] * 5)), "1-4 addresses"),
        (lambda: _raw(_payload(addresses=["/dns4/example.com/tcp/80"])), "not a canonical"),
        (lambda: _raw(_payload(addresses=["/ip4/203.0.113.7/udp/1/quic"])), "not a canonical"),
        (lambda: _raw(_payload(addresses=[f"{ADDRESS}/p2p/{'1' * 46}"])), "attested address"),
        (lambda: _raw(_payload(addresses=["/ip4/203.0.113.007/tcp/1"])), "attested address"),
        (lambda: _raw(_payload(addresses=["garbage"])), "attested address"),
        (lambda: _raw(_payload(subject=b"\x00\x03abc")), "peer id"),
        (lambda: _raw(_payload(issued_at=float("nan"))), "impossible issue time"),
    ],
)
def test_bad_attestations_are_refused(make: object, reason: str) -> None:
    data = make()  # type: ignore[operator]
    with pytest.raises(InvalidMessage, match=reason):
        open_attestation(data, subject=NODE, signers={SEED}, now=NOW + 10)


def test_a_self_attestation_is_refused_whoever_asks() -> None:
    sealed = _raw(_payload(subject=SEED))
    with pytest.raises(InvalidMessage, match="its own subject"):
        open_attestation(sealed, now=NOW)


@pytest.mark.parametrize(
    "addresses", [[], [ADDRESS] * 5, ["/dns4/example.com/tcp/80"], ["/ip4/1.2.3.4/tcp/1/p2p-circuit"]]
)
def test_a_seed_never_seals_what_would_not_open(addresses: list[str]) -> None:
    with pytest.raises(InvalidMessage):
        _attest(addresses=addresses)


def test_node_records_carry_a_capped_few_attestations_and_old_records_still_parse() -> None:
    sealed = _attest()
    record = live_member(NODE, (ADDRESS,), attestations=(sealed,)).record
    assert NodeRecord.from_payload(record.to_payload()).attestations == (sealed,)
    old = pb.NodeRecord.FromString(record.to_payload())
    old.ClearField("attestations")  # what a node of the previous version publishes
    assert NodeRecord.from_payload(old.SerializeToString()).attestations == ()
    too_many = pb.NodeRecord.FromString(record.to_payload())
    too_many.attestations[:] = [sealed] * (MAX_ATTESTATIONS + 1)
    with pytest.raises(InvalidMessage, match="attestations"):
        NodeRecord.from_payload(too_many.SerializeToString())
    oversized = pb.NodeRecord.FromString(record.to_payload())
    oversized.attestations[:] = [bytes(MAX_ATTESTATION_BYTES + 1)]
    with pytest.raises(InvalidMessage, match="attestations"):
        NodeRecord.from_payload(oversized.SerializeToString())


def test_holder_announcements_carry_a_capped_few_attestations_and_old_ones_still_parse() -> None:
    sealed = _attest()
    announcement = HolderAnnouncement(
        run_id="r", version=1, content_id=bytes(32), chunks_held=1, num_chunks=2,
        addresses=(ADDRESS,), attestations=(sealed,),
    )  # fmt: skip
    assert HolderAnnouncement.from_payload(announcement.to_payload()).attestations == (sealed,)
    message = bpb.HolderAnnouncement.FromString(announcement.to_payload())
    message.ClearField("attestations")
    assert HolderAnnouncement.from_payload(message.SerializeToString()).attestations == ()
    for bad in ([sealed] * (MAX_ATTESTATIONS + 1), [bytes(MAX_ATTESTATION_BYTES + 1)]):
        message.attestations[:] = bad
        with pytest.raises(InvalidMessage, match="attestation"):
            HolderAnnouncement.from_payload(message.SerializeToString())


def test_the_default_clock_is_now() -> None:
    sealed = seal_attestation(SEED_KEY, subject=NODE, addresses=[ADDRESS])
    assert open_attestation(sealed, subject=NODE, signers={SEED}).issued_at <= time.time()
