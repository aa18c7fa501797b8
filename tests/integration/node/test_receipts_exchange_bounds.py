"""The receipts exchange across restarts and against floods, on a loopback swarm of real p2pd daemons.

- A puller keeps each peer's cursor in its ledger: restarted on the same ledger file, it asks a
  peer only for what that peer stored since, instead of re-reading everything.
- A peer that serves many receipts of one prolific signer gets at most `max_pulled_per_signer` of
  them stored per window; the surplus is counted and asked for again in later windows (never
  skipped), while the other signers' receipts are kept, and receipts already held do not use up
  a signer's quota.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import PeerID

from node.ledger import Ledger
from node.membership import LiveNode
from node.metrics import NodeMetrics
from node.receipts import ReceiptExchange, ReceiptsConfig, ReceiptServer, SignerQuota, parse_receipts_request
from node.receipts.client import PullResult
from protocol.receipts import receipt_id
from tests.helpers import receipts as make
from tests.helpers.broadcast import Swarm, SwarmNode, open_swarm
from tests.helpers.members import live_member
from tests.helpers.receipts import RUN, new_peer


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("receipts-bounds-swarm"), num_nodes=2)


class RecordingServer(ReceiptServer):
    """Serves its ledger and remembers the cursor (`after`) of every request."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(dht=None, ledger=ledger, config=ReceiptsConfig())
        self.asked_after: list[int] = []

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        self.asked_after.append(parse_receipts_request(frame).after)
        return await super().answer(peer, frame)


@asynccontextmanager
async def serving(node: SwarmNode, ledger: Ledger) -> AsyncIterator[RecordingServer]:
    server = RecordingServer(ledger)
    server.dht = node.dht
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def puller(
    node: SwarmNode, ledger: Ledger, on_pulled: Any = None, **config: Any
) -> AsyncIterator[ReceiptExchange]:
    """A pull-only exchange whose cycles are driven by the test (`pull_from`)."""
    exchange = ReceiptExchange(
        dht=node.dht,
        identity=node.identity,
        ledger=ledger,
        config=ReceiptsConfig(serve=False, peers_per_cycle=0, **config),
        on_pulled=on_pulled,
    )
    await exchange.start()
    try:
        yield exchange
    finally:
        await exchange.stop()


def _member(node: SwarmNode) -> LiveNode:
    return live_member(
        node.identity.peer_id_bytes,
        tuple(str(address) for address in node.dht.get_visible_maddrs()),
        run_id=RUN,
    )


def _receipts(count: int) -> list[bytes]:
    signer, _ = new_peer()
    return [make.transfer(signer, new_peer()[1]) for _ in range(count)]


def test_a_restarted_puller_resumes_at_the_cursor_kept_in_its_ledger(swarm: Swarm, tmp_path: Path) -> None:
    server_node, puller_node = swarm.nodes
    first, later = _receipts(6), _receipts(3)
    member = _member(server_node)
    peer = server_node.identity.peer_id_bytes

    async def main() -> None:
        with Ledger(tmp_path / "served.db", RUN) as served:
            served.add_many(first)
            async with serving(server_node, served) as server:
                with Ledger(tmp_path / "pulled.db", RUN) as pulled:
                    async with puller(puller_node, pulled, page_size=4) as exchange:
                        result = await exchange.pull_from(member)
                        assert (result.added, result.cursor, result.complete) == (6, 6, True)
                        assert server.asked_after == [0, 4]
                served.add_many(later)
                server.asked_after.clear()
                with Ledger(tmp_path / "pulled.db") as reopened:  # the node restarted
                    assert reopened.pull_cursors() == [(peer, 6)]
                    async with puller(puller_node, reopened, page_size=4) as exchange:
                        assert exchange.cursors == {peer: 6}
                        result = await exchange.pull_from(member)
                        assert server.asked_after == [6]  # only what was stored since
                        assert (result.received, result.added, result.duplicates) == (3, 3, 0)
                        assert set(reopened.envelopes()) == set(first + later)

    asyncio.run(main())


def test_the_ledger_keeps_the_cursors_of_the_most_recently_pulled_peers_only(tmp_path: Path) -> None:
    peers = [new_peer()[1] for _ in range(4)]
    with Ledger(tmp_path / "cursors.db", RUN) as ledger:
        for step, peer in enumerate(peers):
            ledger.save_pull_cursor(peer, 10 + step, keep=3, now=100.0 + step)
        ledger.save_pull_cursor(peers[1], 50, keep=3, now=200.0)  # moved forward, pulled last
        assert ledger.pull_cursors() == [(peers[2], 12), (peers[3], 13), (peers[1], 50)]


def test_a_prolific_signers_surplus_waits_for_its_next_window_while_other_signers_are_kept(
    swarm: Swarm, tmp_path: Path
) -> None:
    server_node, puller_node = swarm.nodes
    prolific, prolific_id = new_peer()
    flood = [make.transfer(prolific, new_peer()[1]) for _ in range(10)]
    others = _receipts(1) + _receipts(1) + _receipts(1)
    # the other signers' receipts come after the flood, so a cap per pull would cut them off
    page = flood[:5] + others[:1] + flood[5:] + others[1:]
    member = _member(server_node)
    metrics = NodeMetrics()

    def count(pulled: PullResult) -> None:
        metrics.receipts_pulled(
            stored=pulled.added, duplicate=pulled.duplicates, expired=pulled.skipped, deferred=pulled.capped
        )

    def stored_from(ledger: Ledger, signer: bytes) -> int:
        return sum(receipt.signer == signer for receipt in ledger.receipts())

    async def main() -> None:
        with Ledger(tmp_path / "flood.db", RUN) as served, Ledger(tmp_path / "kept.db", RUN) as pulled:
            served.add_many(page)
            async with (
                serving(server_node, served),
                puller(puller_node, pulled, max_pulled_per_signer=4, on_pulled=count) as exchange,
            ):
                result = await exchange.pull_from(member)
                assert (result.received, result.added, result.capped, result.banned) == (13, 7, 6, False)
                assert stored_from(pulled, prolific_id) == 4
                assert all(pulled.get(receipt_id(receipt)) is not None for receipt in others)
                # the surplus is not skipped: the cursor stays before its page
                assert (result.cursor, result.complete, exchange.cursors[result.peer]) == (0, False, 0)
                assert exchange.capped == 6

                # the window goes on: the same page is asked for again, its held receipts are
                # duplicates, the prolific signer still waits and a newcomer is kept
                more, newcomer = [make.transfer(prolific, new_peer()[1]) for _ in range(2)], _receipts(1)
                served.add_many(more + newcomer)
                result = await exchange.pull_from(member)
                assert (result.received, result.duplicates, result.added, result.capped) == (16, 7, 1, 8)
                assert stored_from(pulled, prolific_id) == 4 and exchange.capped == 14 and result.cursor == 0

            # receipts already held are duplicates, not a use of the quota: each new window (a
            # fresh quota; the cursor kept in the ledger) stores 4 more of the prolific signer,
            # until none is left and the cursor moves on
            for stored, capped in ((8, 4), (12, 0)):
                async with (
                    serving(server_node, served),
                    puller(puller_node, pulled, max_pulled_per_signer=4, on_pulled=count) as exchange,
                ):
                    again = await exchange.pull_from(member)
                    assert (again.received, again.added, again.capped) == (16, 4, capped)
                    assert stored_from(pulled, prolific_id) == stored
            assert (again.cursor, again.complete) == (16, True)
            assert set(pulled.envelopes()) == set(page + more + newcomer)
        figures = metrics.figures().receipts_pulled
        assert figures == {"stored": 7 + 1 + 4 + 4, "duplicate": 7 + 8 + 12, "deferred": 6 + 8 + 4}

    asyncio.run(main())


def test_a_signers_quota_is_renewed_when_its_window_ends() -> None:
    prolific, _ = new_peer()
    receipts = [make.transfer(prolific, new_peer()[1]) for _ in range(5)]
    quota = SignerQuota(per_window=2, window_s=60.0)
    kept, dropped = quota.admit(receipts[:3], now=0.0)
    assert (kept, dropped) == (receipts[:2], 1)
    assert quota.admit(receipts[3:4], now=59.0) == ([], 1)
    assert quota.admit(receipts[3:], now=60.0) == (receipts[3:], 0)
    assert quota.dropped == 2
    # an envelope whose signer cannot be read is passed on, for the ledger to refuse (and ban)
    assert quota.admit([b"junk"], now=61.0) == ([b"junk"], 0)


def test_the_runs_named_signers_are_pulled_in_full_past_the_per_signer_quota(
    swarm: Swarm, tmp_path: Path
) -> None:
    """A busy run's validator signs far more verdicts per hour than any per-signer quota: held back,
    they made a dashboard's and every node's ledger lag further behind the run, hour after hour."""
    server_node, puller_node = swarm.nodes
    validator, validator_id = new_peer()
    verdicts = [make.transfer(validator, new_peer()[1]) for _ in range(10)]
    stranger = _receipts(10)
    member = _member(server_node)

    async def main() -> None:
        with Ledger(tmp_path / "busy.db", RUN) as served, Ledger(tmp_path / "dash.db", RUN) as pulled:
            served.add_many(verdicts + stranger)
            named = [PeerID(validator_id).to_base58()]
            async with (
                serving(server_node, served),
                puller(puller_node, pulled, max_pulled_per_signer=4, trusted_signers=named) as exchange,
            ):
                result = await exchange.pull_from(member)
                assert (result.added, result.capped) == (10 + 4, 6)  # the stranger alone is held to 4
                assert sum(r.signer == validator_id for r in pulled.receipts()) == 10

    asyncio.run(main())
