"""A node's side of address attestations (#30 item 6): the seed that reached it signs one, the node
keeps the newest of each of a few seeds, publishes them in its record, and re-checks before they
lapse; it trusts as attesters only its own initial peers. Fakes only: nothing is dialled."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hivemind.p2p import PeerID

from node.attestations import AttestationBook, AttestationRenewal, trusted_attesters
from node.identity import create_identity
from node.membership import Membership
from node.reachability import DialBackService, _verified
from protocol.address_attestation import (
    ATTESTATION_TTL_S,
    MAX_ATTESTATIONS,
    open_attestation,
    seal_attestation,
)
from protocol.envelope import open_envelope
from protocol.node_record import NodeRecord, Reachability, Role
from tests.helpers.receipts import new_peer
from tests.helpers.virtual_time import VirtualClockLoop

NOW = 1_800_000_000.0
ADDRESS = "/ip4/93.184.216.34/tcp/31337"


def test_the_trusted_attesters_are_the_initial_peers_ids() -> None:
    _, seed = new_peer()
    base58 = PeerID(seed).to_base58()
    peers = [
        f"/ip4/93.184.216.34/tcp/1/p2p/{base58}",
        f"/dns4/seed.example.org/tcp/2/p2p/{base58}",
        "/ip4/1.2.3.4/tcp/3",
    ]
    assert trusted_attesters(peers) == {seed}


def test_a_seed_that_reaches_a_requester_answers_with_an_attestation_the_requester_accepts() -> None:
    seed_key, seed = new_peer()
    _, node = new_peer()
    service = DialBackService(allow_private=False, attester=seed_key)
    sealed = service._attest(PeerID(node), [ADDRESS])
    attestation = open_attestation(sealed, subject=node, signers={seed})
    assert attestation.addresses == (ADDRESS,)
    assert _verified(sealed, PeerID(seed), PeerID(node)) == sealed
    # another seed's word, or one about someone else, is not kept; an old seed sends none
    assert _verified(sealed, PeerID(new_peer()[1]), PeerID(node)) is None
    assert _verified(sealed, PeerID(seed), PeerID(new_peer()[1])) is None
    assert _verified(b"", PeerID(seed), PeerID(node)) is None
    assert DialBackService(allow_private=False)._attest(PeerID(node), [ADDRESS]) == b""


def test_the_book_keeps_the_newest_valid_attestation_of_each_of_a_few_seeds() -> None:
    _, node = new_peer()
    seeds = [new_peer() for _ in range(MAX_ATTESTATIONS + 1)]
    book = AttestationBook(node, {peer for _, peer in seeds})

    def attest(key: object, at: float, subject: bytes = node) -> bytes:
        return seal_attestation(key, subject=subject, addresses=[ADDRESS], issued_at=at)  # type: ignore[arg-type]

    first, second = attest(seeds[0][0], NOW), attest(seeds[0][0], NOW + 60)
    assert book.add(first, now=NOW) and book.current(now=NOW) == (first,)
    assert book.add(second, now=NOW + 60) and book.current(now=NOW + 60) == (second,)
    assert not book.add(first, now=NOW + 60)  # an older one of the same seed changes nothing
    assert not book.add(attest(seeds[1][0], NOW, subject=new_peer()[1]), now=NOW)  # about someone else
    for index, (key, _) in enumerate(seeds[1:], start=1):
        assert book.add(attest(key, NOW + 60 + index), now=NOW + 60 + index)
    held = book.current(now=NOW + 100)
    assert len(held) == MAX_ATTESTATIONS and second not in held  # the one that lapses first made way
    assert book.current(now=NOW + ATTESTATION_TTL_S + 200) == ()  # lapsed ones are never published


def test_renewal_asks_first_the_seed_without_an_attestation_then_the_one_that_lapses_soonest() -> None:
    _, node = new_peer()
    (key_a, a), (key_b, b), (_, c) = new_peer(), new_peer(), new_peer()
    book = AttestationBook(node, {a, b, c})
    book.add(seal_attestation(key_a, subject=node, addresses=[ADDRESS], issued_at=NOW + 10), now=NOW + 10)
    book.add(seal_attestation(key_b, subject=node, addresses=[ADDRESS], issued_at=NOW), now=NOW + 10)
    address = {peer: f"/ip4/93.184.216.34/tcp/1/p2p/{PeerID(peer).to_base58()}" for peer in (a, b, c)}
    assert book.renewal_order([address[a], address[b], address[c]]) == [address[c], address[b], address[a]]


class StoringDHT:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    async def store(self, key: str, value: bytes, expires_at: float, **_: object) -> bool:
        self.values.append(value)
        return True


def test_the_record_carries_the_books_attestations_and_is_republished_when_they_change(
    tmp_path: Path,
) -> None:
    identity = create_identity(tmp_path / "node.key")
    seed_key, seed = new_peer()
    book = AttestationBook(identity.peer_id_bytes, {seed})
    dht = StoringDHT()
    membership = Membership(
        dht, identity, run_id="r", roles=[Role.VALIDATOR], public_name="n", addresses=[f"{ADDRESS}/p2p/{identity.peer_id}"],
        record_ttl_s=60, refresh_interval_s=20, software_version="t", protocol_version=1, attestations=book.current,
    )  # fmt: skip

    async def run() -> None:
        await membership.publish()
        await membership.report_reachability(Reachability.PUBLIC)
        book.add(seal_attestation(seed_key, subject=identity.peer_id_bytes, addresses=[ADDRESS]))
        await membership.report_reachability(Reachability.PUBLIC)  # the same finding, a new attestation

    asyncio.run(run())
    assert len(dht.values) == 3
    records = [NodeRecord.from_payload(open_envelope(v, domain="node-record").payload) for v in dht.values]
    assert [len(r.attestations) for r in records] == [0, 0, 1]
    (sealed,) = records[-1].attestations
    assert open_attestation(sealed, subject=identity.peer_id_bytes, signers={seed}).addresses == (ADDRESS,)


def test_renewal_re_checks_every_interval_until_stopped() -> None:
    checks: list[float] = []
    done = asyncio.Event()

    async def check() -> None:
        checks.append(asyncio.get_running_loop().time())
        if len(checks) == 3:
            done.set()
        if len(checks) == 2:
            raise TimeoutError("no seed answered")  # a failed check does not stop the renewals

    async def run() -> None:
        renewal = AttestationRenewal(check, interval_s=900.0)
        await renewal.start()
        await done.wait()
        await renewal.stop()

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(run())
    assert checks == [900.0, 1800.0, 2700.0]
