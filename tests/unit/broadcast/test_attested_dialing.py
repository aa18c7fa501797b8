"""In a public swarm a peer is dialled only at addresses proven to be its own (#30 item 6): an
unexpired attestation, signed by one of this node's own seeds, naming that exact address for that
PeerID. Records (rollouts, receipts) and holder announcements (weight broadcast) carry them. In a
swarm on loopback nothing changes. A fake P2P records the dials; nothing is sent."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hivemind.p2p import PeerID

from node.broadcast.dialing import HolderDialer
from node.broadcast.records import BroadcastRecords, HolderInfo
from node.rollouts.peers import connect_member
from protocol.address_attestation import ATTESTATION_TTL_S, seal_attestation
from protocol.manifest import HolderAnnouncement
from tests.helpers.members import live_member
from tests.helpers.receipts import new_peer
from tests.helpers.recording_p2p import RecordingP2P

PUBLIC = "/ip4/93.184.216.34/tcp/4001"
OTHER_PUBLIC = "/ip4/8.8.8.8/tcp/22"
LOOPBACK = "/ip4/127.0.0.1/tcp/4001"
SEED_KEY, SEED = new_peer()
STRANGER_KEY, STRANGER = new_peer()


def _dialer(own: str, trusted: set[bytes]) -> tuple[HolderDialer, RecordingP2P]:
    p2p = RecordingP2P()

    async def own_addresses() -> tuple[str, ...]:
        return (own,)

    return HolderDialer(p2p, PeerID(new_peer()[1]), own_addresses, trusted), p2p  # type: ignore[arg-type]


def _holder(
    addresses: tuple[str, ...], attestations: tuple[bytes, ...] = (), peer: bytes | None = None
) -> HolderInfo:
    return HolderInfo(PeerID(peer or new_peer()[1]), 1, 1, addresses, attestations)


def _dialled(
    holder: HolderInfo, *, own: str = "/ip4/198.51.100.7/tcp/31337", trusted: set[bytes] | None = None
) -> list[str]:
    dialer, p2p = _dialer(own, {SEED} if trusted is None else trusted)
    asyncio.run(dialer.dial(holder))
    return p2p.dialled


def test_an_unattested_public_address_is_not_dialled() -> None:
    assert _dialled(_holder((PUBLIC,))) == []


def test_an_address_attested_by_an_untrusted_signer_is_not_dialled() -> None:
    _, peer = new_peer()
    sealed = seal_attestation(STRANGER_KEY, subject=peer, addresses=[PUBLIC])
    assert _dialled(_holder((PUBLIC,), (sealed,), peer)) == []


def test_an_address_attested_by_a_trusted_seed_is_dialled_and_only_that_one() -> None:
    _, peer = new_peer()
    sealed = seal_attestation(SEED_KEY, subject=peer, addresses=[PUBLIC])
    holder = _holder((OTHER_PUBLIC, PUBLIC), (sealed,), peer)
    assert _dialled(holder) == [PUBLIC]
    assert _dialled(holder, trusted=set()) == []  # a node that trusts no seed dials no one's word


@pytest.mark.parametrize("case", ["other subject", "expired", "other address"])
def test_an_attestation_of_another_peer_time_or_address_is_worthless(case: str) -> None:
    _, peer = new_peer()
    subject = new_peer()[1] if case == "other subject" else peer
    issued_at = time.time() - 2 * ATTESTATION_TTL_S if case == "expired" else None
    address = OTHER_PUBLIC if case == "other address" else PUBLIC
    sealed = seal_attestation(SEED_KEY, subject=subject, addresses=[address], issued_at=issued_at)
    assert _dialled(_holder((PUBLIC,), (sealed,), peer)) == []


def test_an_attested_private_address_is_still_not_dialled_in_a_public_swarm() -> None:
    _, peer = new_peer()
    sealed = seal_attestation(SEED_KEY, subject=peer, addresses=["/ip4/10.0.0.5/tcp/22", LOOPBACK])
    assert _dialled(_holder(("/ip4/10.0.0.5/tcp/22", LOOPBACK), (sealed,), peer)) == []


def test_a_swarm_on_loopback_dials_unattested_addresses_as_before() -> None:
    assert _dialled(_holder((LOOPBACK,)), own="/ip4/127.0.0.1/tcp/31337", trusted=set()) == [LOOPBACK]


def test_a_member_is_dialled_at_the_addresses_its_record_carries_attestations_for() -> None:
    _, peer = new_peer()
    sealed = seal_attestation(SEED_KEY, subject=peer, addresses=[PUBLIC])
    dialer, p2p = _dialer("/ip4/198.51.100.7/tcp/31337", {SEED})
    asyncio.run(connect_member(dialer, live_member(peer, (OTHER_PUBLIC, PUBLIC), attestations=(sealed,))))
    assert p2p.dialled == [PUBLIC] and dialer.unattested == 1


class FakeSigned:
    """The DHT seen through `SignedRecords`: stores what is announced, returns it as verified values."""

    def __init__(self, peer: bytes) -> None:
        self.identity = SimpleNamespace(peer_id=PeerID(peer))
        self.payloads: list[bytes] = []

    async def store(self, key: str, *, payload: bytes, **_: object) -> bool:
        self.payloads.append(payload)
        return True

    async def get(self, key: str, **_: object) -> list[Any]:
        return [SimpleNamespace(payload=p, signer=self.identity.peer_id.to_bytes()) for p in self.payloads]


def test_holder_announcements_carry_the_holders_attestations_to_the_fetchers_dialler() -> None:
    _, peer = new_peer()
    sealed = seal_attestation(SEED_KEY, subject=peer, addresses=[PUBLIC])
    signed = FakeSigned(peer)

    async def visible() -> list[str]:
        return [PUBLIC]

    records = BroadcastRecords(
        signed=signed,  # type: ignore[arg-type]
        p2p=SimpleNamespace(get_visible_maddrs=visible),  # type: ignore[arg-type]
        config=SimpleNamespace(holder_ttl_s=60.0),  # type: ignore[arg-type]
        authorized=set(),
        held=list,
        own_attestations=lambda: (sealed,),
    )
    manifest = SimpleNamespace(content_id=bytes(32), num_chunks=2)
    entry = SimpleNamespace(run_id="r", version=1, manifest=manifest, chunks_held=1)

    async def announce_and_find() -> list[HolderInfo]:
        await records.announce_holder(entry)  # type: ignore[arg-type]
        return await records.find_holders("r", 1, bytes(32))

    (holder,) = asyncio.run(announce_and_find())
    assert HolderAnnouncement.from_payload(signed.payloads[0]).attestations == (sealed,)
    assert holder.attestations == (sealed,)
    assert _dialled(holder) == [PUBLIC]
