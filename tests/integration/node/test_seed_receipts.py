"""Seeds earn receipts: a node with a ledger signs one for each seed that answered its bootstrap, and
one for the seed that dials it back; a seed that could not be reached, or a dial-back that failed,
earns nothing. The seed that dials a node back attests the address it reached, and the node
publishes that attestation in its record (#30 item 6).

Real nodes on 127.0.0.1 in this process (a seed, which serves the dial-back, and two joiners that
keep a ledger), each with its own DHT and p2pd.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.config import NodeConfig
from node.identity import create_identity
from node.ledger import Ledger
from node.node import HivenetNode
from node.receipts.seeds import bootstrap_receipts, seed_peer_id
from node.rollouts.peers import own_record_addresses
from node.swarm import wait_until
from protocol import receipts_pb2
from protocol.address_attestation import open_attestation
from protocol.node_record import Reachability, Role
from protocol.receipts import Receipt, ReceiptKind, open_receipt

RUN = "seed-receipts"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(root: Path, name: str, peers: list[str], *, seed: bool = False) -> HivenetNode:
    config = NodeConfig(
        identity_path=root / f"{name}.key",
        weights_dir=root / f"{name}-weights",
        initial_peers=peers,
        roles=[Role.SEED] if seed else [Role.VALIDATOR],
        public_name=name,
        run_id=RUN,
        host="127.0.0.1",
        bootstrap_timeout_s=3.0,  # the unreachable seed is retried only this long
        ledger_path=None if seed else root / f"{name}.ledger.db",
    )
    node = HivenetNode(config, dht_only=seed)
    node.start()
    return node


class Nodes:
    def __init__(self, root: Path) -> None:
        self.started: list[HivenetNode] = []
        self.seed = self._add(_start(root, "seed", [], seed=True))
        (self.seed_address,) = self.seed.multiaddrs()
        # a seed nobody runs: a PeerID of its own at a port nothing listens on
        absent = create_identity(root / "absent.key").peer_id.to_base58()
        self.absent_address = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{absent}"
        peers = [self.absent_address, self.seed_address]
        self.joiner = self._add(_start(root, "joiner", peers))
        self.other = self._add(_start(root, "other", peers))

    def _add(self, node: HivenetNode) -> HivenetNode:
        self.started.append(node)
        return node

    def close(self) -> None:
        for node in reversed(self.started):
            node.stop()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    swarm = Nodes(tmp_path_factory.mktemp("seed-receipts"))
    try:
        yield swarm
    finally:
        swarm.close()


def _seed_receipts(node: HivenetNode, service: int) -> list[Receipt]:
    """The seed receipts of `service` that `node` signed (its ledger also pulls the other joiner's)."""
    assert node.ledger is not None
    own = node.identity.peer_id_bytes
    return [
        r
        for r in node.ledger.receipts(with_envelopes=True)
        if r.kind == ReceiptKind.SEED and r.step == service and r.signer == own
    ]


def test_a_joiner_signs_one_bootstrap_receipt_for_the_seed_that_answered_and_none_for_the_absent_one(
    nodes: Nodes,
) -> None:
    statuses = {status.address: status.reached for status in nodes.joiner.seed_statuses}
    assert statuses == {nodes.seed_address: True, nodes.absent_address: False}
    joiner = nodes.joiner
    assert wait_until(
        lambda: len(_seed_receipts(joiner, receipts_pb2.SEED_SERVICE_BOOTSTRAP)) >= 1, timeout_s=10
    )
    (receipt,) = _seed_receipts(joiner, receipts_pb2.SEED_SERVICE_BOOTSTRAP)
    assert receipt.contributor == nodes.seed.identity.peer_id_bytes
    assert receipt.signer == joiner.identity.peer_id_bytes
    assert len(receipt.evidence) == 16 and receipt.count == 1
    # what the ledger holds verifies on its own, as any peer that pulls it will check it
    assert open_receipt(receipt.envelope, run_id=RUN).receipt_id == receipt.receipt_id
    # the seed itself keeps no ledger and signs nothing for itself
    assert nodes.seed.ledger is None and nodes.seed.receipt_sink is None


def test_the_seed_that_dials_a_node_back_earns_a_dial_back_receipt(nodes: Nodes) -> None:
    joiner = nodes.joiner
    # the absent seed is asked first: it cannot answer, so the receipt goes to the one that dialled
    outcome = joiner.check_reachability(seeds=[nodes.absent_address, nodes.seed_address], timeout_s=60)
    assert outcome.reachable, outcome.detail
    assert outcome.seed == nodes.seed.identity.peer_id_bytes
    assert wait_until(
        lambda: len(_seed_receipts(joiner, receipts_pb2.SEED_SERVICE_DIAL_BACK)) == 1, timeout_s=10
    )
    (receipt,) = _seed_receipts(joiner, receipts_pb2.SEED_SERVICE_DIAL_BACK)
    assert (receipt.contributor, receipt.signer) == (
        nodes.seed.identity.peer_id_bytes,
        joiner.identity.peer_id_bytes,
    )
    # its record now says so, for the dashboard's swarm table
    assert wait_until(
        lambda: _published_reachability(nodes.seed, joiner) is Reachability.PUBLIC, timeout_s=30
    )


def test_a_dial_back_that_fails_earns_no_receipt(nodes: Nodes) -> None:
    other = nodes.other
    dead = f"/ip4/127.0.0.1/tcp/{_free_port()}"
    outcome = other.check_reachability(addresses=[dead], timeout_s=60)
    assert not outcome.reachable and outcome.seed is None
    assert "DIAL_BACK_UNREACHABLE" in outcome.detail, outcome.detail
    # its bootstrap receipt arrived (the sink works), yet nothing for the failed dial-back
    assert wait_until(
        lambda: len(_seed_receipts(other, receipts_pb2.SEED_SERVICE_BOOTSTRAP)) == 1, timeout_s=10
    )
    assert _seed_receipts(other, receipts_pb2.SEED_SERVICE_DIAL_BACK) == []
    assert wait_until(
        lambda: _published_reachability(nodes.seed, other) is Reachability.PRIVATE, timeout_s=30
    )
    # a check no seed could answer changes nothing it published
    outcome = other.check_reachability(seeds=[nodes.absent_address], timeout_s=60)
    assert not outcome.answered and not outcome.reachable
    assert other.membership is not None and other.membership.record.reachability is Reachability.PRIVATE


def test_a_node_the_seed_reached_publishes_the_seeds_attestation_of_its_address(
    nodes: Nodes, tmp_path: Path
) -> None:
    node = _start(tmp_path, "attested", [nodes.seed_address])
    try:
        me, seed = node.identity.peer_id_bytes, nodes.seed.identity.peer_id_bytes
        assert node.attestations.trusted == {seed}  # its initial peer, and no one else
        outcome = node.check_reachability(timeout_s=60)
        assert outcome.reachable and outcome.attestation is not None, outcome.detail
        assert node.renewal is not None  # and it re-checks before the attestation lapses
        (address,) = [a.split("/p2p/")[0] for a in node.multiaddrs()]

        def published() -> tuple[bytes, ...]:
            found = [n for n in nodes.seed.discover() if n.record.peer_id == me]
            return found[0].record.attestations if found else ()

        assert wait_until(lambda: published() != (), timeout_s=30)
        (sealed,) = published()
        attestation = open_attestation(sealed, subject=me, signers={seed})
        assert attestation.addresses == (address,)
        (live,) = [n for n in nodes.seed.discover() if n.record.peer_id == me]
        assert address in own_record_addresses(live)  # the very address its record names
    finally:
        node.stop()


def test_bootstrap_receipts_name_each_distinct_answering_seed_once_and_never_the_signer(
    tmp_path: Path,
) -> None:
    me = create_identity(tmp_path / "me.key")
    seed = create_identity(tmp_path / "seed.key").peer_id.to_base58()
    own = me.peer_id.to_base58()
    answered = [
        f"/ip4/127.0.0.1/tcp/1/p2p/{seed}",
        f"/ip4/10.0.0.1/tcp/2/p2p/{seed}",  # the same seed at another address
        f"/ip4/127.0.0.1/tcp/3/p2p/{own}",  # this node among its own initial peers
    ]
    receipts = bootstrap_receipts(me, RUN, answered)
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        assert ledger.add_many(receipts).added == 1
        (receipt,) = ledger.receipts()
    assert receipt.contributor == seed_peer_id(answered[0]) and receipt.signer == me.peer_id_bytes


def _published_reachability(reader: HivenetNode, node: HivenetNode) -> Reachability | None:
    """What `node`'s record, as `reader` finds it in the DHT, says about reaching it."""
    me = node.identity.peer_id_bytes
    return next((n.record.reachability for n in reader.discover() if n.record.peer_id == me), None)
