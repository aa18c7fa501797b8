"""Receipts propagate: a fetch from a publisher yields a transfer receipt, signed by the fetcher and
crediting the publisher, that a third node finds through discovery and pulls into its own ledger.

Three DHT nodes on loopback (publisher, fetcher, observer), real p2pd streams, real membership
records: the observer dials the fetcher only at the addresses of the fetcher's own signed record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.ledger import Ledger
from node.membership import Membership
from node.receipts import ReceiptExchange, ReceiptsConfig
from protocol.manifest import sha256
from protocol.node_record import Role
from protocol.receipts import ReceiptKind
from protocol.version import PROTOCOL_VERSION, SOFTWARE_VERSION
from tests.helpers.broadcast import Swarm, SwarmNode, make_state_dict, open_swarm, start_broadcast
from tests.helpers.waiting import async_wait_until

RUN = "receipts-e2e"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("propagation-swarm"), num_nodes=3)


def _membership(node: SwarmNode) -> Membership:
    return Membership(
        node.dht,
        node.identity,
        run_id=RUN,
        roles=[Role.VALIDATOR],
        public_name="",
        addresses=[str(address) for address in node.dht.get_visible_maddrs()],
        record_ttl_s=60.0,
        refresh_interval_s=20.0,
        software_version=SOFTWARE_VERSION,
        protocol_version=PROTOCOL_VERSION,
        check_identity=False,
    )


def test_a_transfer_receipt_for_the_publisher_reaches_a_third_node_by_pull(
    swarm: Swarm, tmp_path: Path
) -> None:
    publisher, fetcher, observer = swarm.nodes

    async def main() -> None:
        with (
            Ledger(tmp_path / "fetcher.db", RUN) as fetcher_ledger,
            Ledger(tmp_path / "observer.db", RUN) as observer_ledger,
        ):
            pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
            follower = await start_broadcast(fetcher, tmp_path / "fetcher", [publisher])
            serving = ReceiptExchange(
                dht=fetcher.dht,
                identity=fetcher.identity,
                ledger=fetcher_ledger,
                config=ReceiptsConfig(peers_per_cycle=0),
            )
            await serving.start()
            follower.on_receipts = serving.record
            membership = _membership(fetcher)
            await membership.start()
            pulling = ReceiptExchange(
                dht=observer.dht,
                identity=observer.identity,
                ledger=observer_ledger,
                config=ReceiptsConfig(serve=False, pull_interval_s=0.5),
            )
            try:
                manifest = await pub.publish(RUN, 1, make_state_dict(seed=7))
                await follower.fetch(RUN, 1)
                await async_wait_until(lambda: len(fetcher_ledger) == 1, timeout_s=10)
                (receipt,) = fetcher_ledger.receipts()
                assert receipt.kind == ReceiptKind.TRANSFER
                assert receipt.signer == fetcher.identity.peer_id_bytes
                assert receipt.contributor == publisher.identity.peer_id_bytes
                assert (receipt.step, receipt.chunks, receipt.byte_count) == (
                    1,
                    manifest.num_chunks,
                    manifest.total_bytes,
                )
                assert receipt.evidence == sha256(manifest.raw)

                await pulling.start()
                # A pull stores its receipts page by page and moves its cursor once it has ended: the
                # ledger can hold the receipt while the pull is still in flight.
                fetcher_id = fetcher.identity.peer_id_bytes
                await async_wait_until(lambda: pulling.cursors.get(fetcher_id) == 1, timeout_s=30)
                assert list(observer_ledger.envelopes()) == list(fetcher_ledger.envelopes())
                credit = observer_ledger.credit(trusted=[fetcher.identity.peer_id_bytes])
                assert credit.contributors[publisher.identity.peer_id_bytes].roles["broadcast"].total > 0
            finally:
                await pulling.stop()
                await membership.stop()
                await serving.stop()
                for broadcast in (pub, follower):
                    await broadcast.stop()

    asyncio.run(main())
