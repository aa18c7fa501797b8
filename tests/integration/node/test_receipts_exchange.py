"""The receipts exchange on a loopback swarm of real p2pd daemons: one node serves its ledger, another
pulls it page by page; servers that lie are banned and what they lie about is never stored."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.ledger import Ledger
from node.receipts import ReceiptsConfig, ReceiptServer, pull_receipts, receipts_response
from node.rollouts import replicate_p2p
from protocol.limits import MAX_RECEIPTS_RESPONSE_BYTES
from tests.helpers import receipts as make
from tests.helpers.broadcast import Swarm, SwarmNode, open_swarm
from tests.helpers.receipts import RUN, new_peer


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("receipts-swarm"), num_nodes=2)


def _receipts(count: int) -> list[bytes]:
    signer, _ = new_peer()
    return [make.transfer(signer, new_peer()[1]) for _ in range(count)]


@asynccontextmanager
async def serving(node: SwarmNode, server: ReceiptServer) -> AsyncIterator[ReceiptServer]:
    server.dht = node.dht
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def client_of(node: SwarmNode) -> AsyncIterator[P2P]:
    p2p = await replicate_p2p(node.dht)
    try:
        yield p2p
    finally:
        await p2p.shutdown()


def _bans() -> BanList:
    return BanList(60.0, 3600.0, owner="puller")


def test_a_peer_pulls_every_receipt_across_pages_idempotently_and_resumes_at_its_cursor(
    swarm: Swarm, tmp_path: Path
) -> None:
    server_node, puller_node = swarm.nodes
    first, later = _receipts(10), _receipts(5)

    async def main() -> None:
        with Ledger(tmp_path / "served.db", RUN) as served, Ledger(tmp_path / "pulled.db", RUN) as pulled:
            served.add_many(first)
            async with (
                serving(server_node, ReceiptServer(dht=None, ledger=served)),
                client_of(puller_node) as p2p,
            ):
                peer = server_node.identity.peer_id
                bans = _bans()
                whole = await pull_receipts(p2p, peer, pulled, bans=bans, page_size=3, max_receipts=100)
                assert (whole.added, whole.pages, whole.complete, whole.failure) == (10, 4, True, "")
                assert set(pulled.envelopes()) == set(first)
                assert whole.cursor == 10

                again = await pull_receipts(p2p, peer, pulled, bans=bans, page_size=4)
                assert (again.received, again.added, again.duplicates) == (10, 0, 10)
                assert len(pulled) == 10

                served.add_many(later)
                bounded = await pull_receipts(
                    p2p, peer, pulled, bans=bans, after=whole.cursor, page_size=2, max_receipts=3
                )
                assert (bounded.received, bounded.added, bounded.complete) == (3, 3, False)
                rest = await pull_receipts(p2p, peer, pulled, bans=bans, after=bounded.cursor, page_size=2)
                assert (rest.received, rest.added, rest.complete) == (2, 2, True)
                assert set(pulled.envelopes()) == set(first + later)
                assert not bans.is_banned(peer)

    asyncio.run(main())


class LyingServer(ReceiptServer):
    """Answers every request with the same fixed page (or a raw oversized frame)."""

    def __init__(self, ledger: Ledger, page: list[bytes], *, oversized: bool = False, **kwargs: Any) -> None:
        super().__init__(dht=None, ledger=ledger, config=ReceiptsConfig(), **kwargs)
        self.page = page
        self.oversized = oversized

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        if self.oversized:
            return b"\x0a" * (MAX_RECEIPTS_RESPONSE_BYTES + 1)
        return receipts_response(receipts=self.page, next_cursor=len(self.page))


def test_a_server_that_serves_a_forged_receipt_is_banned_and_the_forgery_is_not_stored(
    swarm: Swarm, tmp_path: Path
) -> None:
    server_node, puller_node = swarm.nodes
    signer, _ = new_peer()
    genuine = make.transfer(signer, new_peer()[1])
    forged = bytearray(make.transfer(signer, new_peer()[1]))
    forged[-5] ^= 0x01  # inside the signature
    other_run = make.transfer(signer, new_peer()[1], run_id="another-run")

    async def main() -> None:
        for lie in (bytes(forged), other_run):
            with (
                Ledger(tmp_path / "served.db", RUN) as served,
                Ledger(tmp_path / f"{len(lie)}.db", RUN) as pulled,
            ):
                async with (
                    serving(server_node, LyingServer(served, [genuine, lie])),
                    client_of(puller_node) as p2p,
                ):
                    peer = server_node.identity.peer_id
                    bans = _bans()
                    result = await pull_receipts(p2p, peer, pulled, bans=bans)
                    assert result.banned and bans.is_banned(peer)
                    assert "invalid" in result.failure
                    assert lie not in set(pulled.envelopes())
                    skipped = await pull_receipts(p2p, peer, pulled, bans=bans)
                    assert skipped.failure == "the peer is banned" and skipped.received == 0

    asyncio.run(main())


def test_a_genuine_but_expired_receipt_is_skipped_without_a_ban(swarm: Swarm, tmp_path: Path) -> None:
    server_node, puller_node = swarm.nodes
    signer, _ = new_peer()
    expired = make.transfer(signer, new_peer()[1], issued_at=time.time() - 40 * 86400)
    fresh = make.transfer(signer, new_peer()[1])

    async def main() -> None:
        with Ledger(tmp_path / "served.db", RUN) as served, Ledger(tmp_path / "pulled.db", RUN) as pulled:
            async with (
                serving(server_node, LyingServer(served, [expired, fresh])),
                client_of(puller_node) as p2p,
            ):
                bans = _bans()
                result = await pull_receipts(p2p, server_node.identity.peer_id, pulled, bans=bans)
                assert (result.added, result.skipped, result.banned, result.complete) == (1, 1, False, True)
                assert list(pulled.envelopes()) == [fresh]

    asyncio.run(main())


def test_an_oversized_response_is_refused_before_it_is_buffered_and_its_server_banned(
    swarm: Swarm, tmp_path: Path
) -> None:
    server_node, puller_node = swarm.nodes

    async def main() -> None:
        with Ledger(tmp_path / "served.db", RUN) as served, Ledger(tmp_path / "pulled.db", RUN) as pulled:
            async with (
                serving(server_node, LyingServer(served, [], oversized=True)),
                client_of(puller_node) as p2p,
            ):
                bans = _bans()
                result = await pull_receipts(p2p, server_node.identity.peer_id, pulled, bans=bans)
                assert result.banned and "exceeds" in result.failure
                assert len(pulled) == 0

    asyncio.run(main())
