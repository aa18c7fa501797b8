"""The rollout transport dials a member's record within the dialling limits: a record may list any
addresses, so a fake validator record naming sixteen ports of another host cost it a connection
to each (#30 item 6); now a few public ones at most, never private ones in a public swarm, and
only those a seed this node trusts attested for that member (even a seed's word on twelve
addresses buys a few dials)."""

from __future__ import annotations

import asyncio

from hivemind.p2p import PeerID

from node.broadcast.dialing import MAX_ADDRESSES_PER_DIAL, HolderDialer
from node.rollouts.peers import connect_member
from protocol.address_attestation import seal_attestation
from tests.helpers.members import live_member
from tests.helpers.receipts import new_peer
from tests.helpers.recording_p2p import RecordingP2P


def test_a_record_naming_many_ports_of_other_hosts_costs_them_a_few_public_dials_at_most() -> None:
    victim = tuple(f"/ip4/93.184.216.34/tcp/{port}" for port in range(9000, 9013))  # 16 addresses in all
    private = ("/ip4/10.0.0.5/tcp/22", "/ip4/127.0.0.1/tcp/6379", "/ip4/169.254.169.254/tcp/80")
    p2p = RecordingP2P(reachable=False)

    async def public_node() -> tuple[str, ...]:
        return ("/ip4/198.51.100.7/tcp/31337",)

    seed_key, seed = new_peer()
    dialer = HolderDialer(p2p, PeerID(new_peer()[1]), public_node, {seed})  # type: ignore[arg-type]
    member_id = new_peer()[1]
    # three attestations of four addresses each, the most a record holds; the first victim ports unattested
    attested = private + victim[4:13]
    attestations = tuple(
        seal_attestation(seed_key, subject=member_id, addresses=attested[i : i + 4]) for i in range(0, 12, 4)
    )
    member = live_member(member_id, private + victim, name="fake validator", attestations=attestations)
    for _ in range(5):  # a worker asks for tickets, submits, asks again...
        asyncio.run(connect_member(dialer, member))
    assert len(p2p.dialled) == MAX_ADDRESSES_PER_DIAL  # once, then the failed addresses back off
    assert all(a.startswith("/ip4/93.184.216.34/") for a in p2p.dialled)  # never a private one
    assert set(p2p.dialled) <= set(victim[4:])  # nor one no trusted seed attested
