"""The receipts exchange service without a network: storing the node's own receipts from any thread,
choosing whom to pull from (never itself or a banned peer, least recently pulled first), the
addresses it dials (those of the member's own record) and the ledger bound that stops pulling."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

from hivemind.p2p import PeerID

from node.identity import Identity
from node.ledger import Ledger
from node.membership import LiveNode
from node.receipts import ReceiptExchange, ReceiptsConfig
from node.rollouts.peers import own_record_addresses
from protocol.receipts import receipt_id
from tests.helpers import receipts as make
from tests.helpers.members import live_member
from tests.helpers.receipts import RUN, new_peer
from tests.helpers.waiting import async_wait_until


def _identity(private_key: Any) -> Identity:
    return Identity(private_key=private_key, path=Path("/nonexistent/key"))


def _member(peer_id: bytes, addresses: tuple[str, ...] = ()) -> LiveNode:
    return live_member(peer_id, addresses, run_id=RUN)


def _exchange(ledger: Ledger, key: Any, **config: Any) -> ReceiptExchange:
    return ReceiptExchange(
        dht=None,  # type: ignore[arg-type]
        identity=_identity(key),
        ledger=ledger,
        config=ReceiptsConfig(serve=False, **config),
        p2p=object(),  # type: ignore[arg-type]
    )


def test_own_receipts_recorded_from_another_thread_are_stored_and_invalid_ones_refused(
    tmp_path: Path,
) -> None:
    key, _ = new_peer()
    receipts = [make.transfer(key, new_peer()[1]) for _ in range(3)]

    async def main() -> None:
        with Ledger(tmp_path / "own.db", RUN) as ledger:
            exchange = _exchange(ledger, key, peers_per_cycle=0)
            await exchange.start()
            thread = threading.Thread(target=exchange.record, args=([*receipts, b"junk"],))
            thread.start()
            thread.join()
            await async_wait_until(lambda: exchange.recorded == 3, timeout_s=10)
            exchange.record(receipts)  # from the loop itself; duplicates are idempotent
            await exchange.stop()  # waits for what is being stored
            assert set(ledger.envelopes()) == set(receipts) and exchange.recorded == 3

    asyncio.run(main())


def test_peers_are_chosen_least_recently_pulled_first_never_itself_or_a_banned_one(tmp_path: Path) -> None:
    key, own = new_peer()
    peers = [new_peer()[1] for _ in range(4)]
    with Ledger(tmp_path / "choose.db", RUN) as ledger:
        exchange = _exchange(ledger, key, peers_per_cycle=2)
        live = [_member(peer) for peer in [own, *peers]]
        exchange.bans.ban(peers[3], "bad receipts: test")
        exchange._remember(peers[0], 5)
        exchange._remember(peers[1], 9)
        chosen = [member.record.peer_id for member in exchange.choose_peers(live)]
        assert chosen == [peers[2], peers[0]]  # never pulled, then the one pulled longest ago
        exchange._remember(peers[2], 1)
        assert [m.record.peer_id for m in exchange.choose_peers(live)] == [peers[0], peers[1]]


def test_sybil_records_listed_first_do_not_keep_honest_peers_from_being_pulled(tmp_path: Path) -> None:
    """Sybil node records with `started_at=0` come first in discovery; they used to fill every cycle."""
    validator, honest = new_peer()[1], new_peer()[1]
    sybils = [new_peer()[1] for _ in range(200)]
    early = [_member(peer) for peer in sybils]
    live = [
        *(dataclasses.replace(m, record=m.record.model_copy(update={"started_at": 0.0})) for m in early),
        _member(honest),
        _member(validator),
    ]
    with Ledger(tmp_path / "starve.db", RUN) as ledger:
        exchange = _exchange(
            ledger, new_peer()[0], peers_per_cycle=4, trusted_signers=[PeerID(validator).to_base58()]
        )
        pulled: set[bytes] = set()
        for _ in range(120):  # cycles; each pull is remembered, as `pull_from` does
            chosen = [member.record.peer_id for member in exchange.choose_peers(live)]
            assert validator in chosen  # the run's signer, in every cycle
            for peer in chosen:
                exchange._remember(peer, 0)
            pulled.update(chosen)
        assert honest in pulled


def test_no_pull_cycle_runs_while_the_ledger_is_at_its_bound(tmp_path: Path) -> None:
    key, _ = new_peer()

    async def fail() -> list[LiveNode]:
        raise AssertionError("a full ledger looked for peers to pull from")

    async def main() -> None:
        with Ledger(tmp_path / "full.db", RUN) as ledger:
            ledger.add_many([make.transfer(key, new_peer()[1]) for _ in range(2)])
            exchange = _exchange(ledger, new_peer()[0], max_ledger_receipts=2)
            exchange.find_peers = fail
            assert await exchange.pull_cycle() == []

    asyncio.run(main())


def test_a_ledger_at_its_bound_with_junk_evicts_it_and_pulls_again(tmp_path: Path) -> None:
    """It used to stop pulling for good once junk from fresh identities had filled it."""
    junk = [make.transfer(new_peer()[0], new_peer()[1]) for _ in range(3)]
    looked: list[bool] = []

    async def nobody() -> list[LiveNode]:
        looked.append(True)
        return []

    async def main() -> None:
        with Ledger(tmp_path / "junk.db", RUN) as ledger:
            ledger.add_many(junk)
            ledger.mark_unvouched([receipt_id(r) for r in junk], source=b"flooder")
            exchange = _exchange(ledger, new_peer()[0], max_ledger_receipts=2)
            exchange.find_peers = nobody
            await exchange.pull_cycle()
            assert looked and len(ledger) < 2 and exchange.standing.evicted == 2

    asyncio.run(main())


def test_a_member_is_dialled_only_at_its_own_records_addresses() -> None:
    peer, other = new_peer()[1], new_peer()[1]
    own, elsewhere = PeerID(peer).to_base58(), PeerID(other).to_base58()
    member = _member(
        peer, (f"/ip4/1.2.3.4/tcp/5/p2p/{own}", f"/ip4/1.2.3.4/tcp/6/p2p/{elsewhere}", "/ip4/5.6.7.8/tcp/7")
    )
    assert own_record_addresses(member) == ("/ip4/1.2.3.4/tcp/5", "/ip4/5.6.7.8/tcp/7")
