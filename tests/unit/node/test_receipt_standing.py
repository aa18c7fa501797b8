"""Pulled receipts of signers without standing in the run: kept within a budget per source and in
all, evicted first, so a flood of genuine receipts from fresh identities neither fills the disk
nor stops the pulls (it used to stop them for good once the ledger reached its cap)."""

from __future__ import annotations

from pathlib import Path

from node.ledger import Ledger
from node.receipts.client import PullResult, _store_page
from node.receipts.standing import StandingFilter
from protocol.receipts import receipt_id
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer

SOURCES = [bytes([i]) * 38 for i in range(1, 5)]


def _junk(count: int) -> list[bytes]:
    """Genuine receipts, each signed by a fresh identity for another: credit zero, disk not."""
    out = []
    for _ in range(count):
        key, _ = new_peer()
        _, contributor = new_peer()
        out.append(make.training(key, contributor, tokens=1000))
    return out


def _store(ledger: Ledger, source: bytes, receipts: list[bytes], standing: StandingFilter) -> PullResult:
    result = PullResult(peer=source, cursor=0)
    _store_page(ledger, receipts, result, None, standing)
    return result


def test_a_flood_of_fresh_signers_is_kept_within_its_budgets_and_honest_receipts_in_full(
    tmp_path: Path,
) -> None:
    validator_key, validator = new_peer()
    worker_key, worker = new_peer()
    own_key, own = new_peer()
    standing = StandingFilter([validator], own=own, per_source=40, total=100)
    with Ledger(tmp_path / "ledger.db", RUN) as ledger:
        honest = [make.verdict(validator_key, worker, tokens=10) for _ in range(30)]
        _store(ledger, SOURCES[0], honest, standing)
        standing.refresh(ledger)  # the worker earned credit from the run's validator: it has standing
        vouched = [make.transfer(worker_key, new_peer()[1], byte_count=1 << 20) for _ in range(30)]
        mine = [make.seed(own_key, new_peer()[1]) for _ in range(5)]
        for source in SOURCES:
            result = _store(ledger, source, _junk(60), standing)
            assert result.added == 40 and result.unvouched_dropped == 20  # this source's budget
        _store(ledger, SOURCES[1], vouched + mine, standing)
        assert ledger.unvouched_count() == 100  # the total budget: the oldest junk was evicted
        assert all(ledger.unvouched_count(source) <= 40 for source in SOURCES)
        assert len(ledger) == 30 + 30 + 5 + 100
        assert ledger.stored(receipt_ids(honest + vouched + mine)) == set(
            receipt_ids(honest + vouched + mine)
        )


def test_a_full_ledger_evicts_unvouched_receipts_and_keeps_pulling(tmp_path: Path) -> None:
    validator_key, validator = new_peer()
    _, worker = new_peer()
    standing = StandingFilter([validator], own=new_peer()[1], per_source=1000, total=1000)
    with Ledger(tmp_path / "ledger.db", RUN) as ledger:
        for source in SOURCES[:2]:
            _store(ledger, source, _junk(50), standing)
        assert len(ledger) == 100
        assert standing.make_room(ledger, cap=80)  # at its cap: the junk makes room
        assert len(ledger) < 80 and standing.evicted == 21
        honest = [make.verdict(validator_key, worker, tokens=10) for _ in range(10)]
        assert _store(ledger, SOURCES[2], honest, standing).added == 10
    with Ledger(tmp_path / "honest.db", RUN) as ledger:
        _store(
            ledger, SOURCES[0], [make.verdict(validator_key, worker, tokens=10) for _ in range(20)], standing
        )
        # a ledger full of receipts that count: nothing to evict, so no pull
        assert not standing.make_room(ledger, cap=10) and len(ledger) == 20


def receipt_ids(envelopes: list[bytes]) -> list[bytes]:
    return [receipt_id(e) for e in envelopes]
