"""The ledger store: re-verification before storing, idempotent duplicates, restarts, exports and audits."""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from pathlib import Path

import pytest

from node.ledger import Ledger, audit_export, write_export
from protocol.errors import ConfigError, InvalidMessage
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import ReceiptKind, receipt_id
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer


def test_add_stores_verified_receipts_and_duplicates_are_idempotent(tmp_path: Path) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    first, second = make.verdict(key, worker), make.training(key, worker)
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        assert ledger.add(first) is True
        assert ledger.add(first) is False
        result = ledger.add_many([second, first, second])
        assert (result.added, result.duplicates, result.refused) == (1, 2, [])
        assert len(ledger) == 2
        kinds = [receipt.kind for receipt in ledger.receipts()]
        assert kinds == [ReceiptKind.ROLLOUT, ReceiptKind.TRAINING]
        stored = ledger.get(receipt_id(second))
        assert stored is not None and stored.envelope == second and stored.contributor == worker


def test_invalid_receipts_are_refused_and_the_rest_of_the_batch_is_kept(tmp_path: Path) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    good = make.seed(key, worker)
    tampered = bytearray(make.seed(key, worker))
    tampered[-5] ^= 0x01  # inside the signature
    other_run = make.seed(key, worker, run_id="another-run")
    expired = make.seed(key, worker, issued_at=time.time() - 40 * 86400)
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        result = ledger.add_many([bytes(tampered), good, other_run, expired, b"junk", b"x" * 100_000])
        assert result.added == 1
        reasons = dict(result.refused)
        assert set(reasons) == {0, 2, 3, 4, 5}
        assert "signature" in reasons[0] and "run" in reasons[2] and "expired" in reasons[3]
        assert "exceeds" in reasons[5]
        with pytest.raises(InvalidMessage):
            ledger.add(bytes(tampered))
        assert len(ledger) == 1


def test_ledger_survives_a_restart_and_keeps_its_run(tmp_path: Path) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    batch = [make.transfer(key, worker) for _ in range(20)]
    path = tmp_path / "l.db"
    with Ledger(path, RUN) as ledger:
        assert ledger.add_many(batch).added == 20
    with Ledger(path) as reopened:
        assert reopened.run_id == RUN
        assert [r.envelope for r in reopened.receipts(with_envelopes=True)] == batch
        assert list(reopened.envelopes()) == batch
        assert list(reopened.envelopes(upto=5)) == batch[:5]
        assert reopened.add_many(batch).duplicates == 20
        assert sum(1 for _ in reopened.receipts(contributor=worker)) == 20
    with pytest.raises(ConfigError, match="records run"):
        Ledger(path, "another-run")
    with pytest.raises(ConfigError, match="new ledger"):
        Ledger(tmp_path / "new.db")
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_export_then_audit_recomputes_credit_offline(tmp_path: Path) -> None:
    validator_key, validator = new_peer()
    _, alice = new_peer()
    _, bob = new_peer()
    batch = [make.verdict(validator_key, alice, tokens=10) for _ in range(3)]
    batch += [
        make.verdict(validator_key, bob, tokens=7),
        make.verdict(validator_key, bob, accepted=False, reason="stale"),
    ]
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        ledger.add_many(batch)
        out = tmp_path / "export.jsonl"
        assert ledger.export(out) == 5
        live = ledger.credit(trusted=[validator])
    report = audit_export(out, trusted=[validator])
    assert report.ok and report.valid == 5 and report.run_id == RUN
    assert report.credit is not None
    totals = {peer: c.total for peer, c in report.credit.contributors.items()}
    assert totals == {alice: 30.0, bob: 7.0}
    assert totals == {peer: c.total for peer, c in live.contributors.items()}


def test_audit_reports_a_tampered_line_and_a_truncated_file(tmp_path: Path) -> None:
    key, validator = new_peer()
    _, worker = new_peer()
    batch = [make.verdict(key, worker, tokens=10) for _ in range(4)]
    out = tmp_path / "export.jsonl"
    write_export(batch, out, run_id=RUN, count=4)
    lines = out.read_text().splitlines()
    envelope = bytearray(base64.b64decode(json.loads(lines[2])["receipt"]))
    envelope[len(envelope) // 2] ^= 0x01  # one bit inside the signed body
    lines[2] = json.dumps({"receipt": base64.b64encode(bytes(envelope)).decode()})
    lines[3] = '{"receipt": "not base64!"}'
    out.write_text("\n".join([*lines, lines[1]]) + "\n")  # plus a duplicated line
    report = audit_export(out, trusted=[validator])
    assert not report.ok
    assert [number for number, _ in report.invalid] == [3, 4]
    assert report.valid == 2 and report.duplicates == 1
    assert report.credit is not None and report.credit.contributors[worker].total == 20.0

    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(out.read_text().splitlines()[:2]) + "\n")
    short = audit_export(truncated)
    assert short.invalid == [] and short.lines_read == 1 and short.declared == 4 and not short.ok


def test_audit_refuses_a_file_that_is_not_an_export(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"format": "something-else"}\n')
    with pytest.raises(InvalidMessage, match="header"):
        audit_export(path)


def test_an_oversized_line_is_reported_without_being_buffered_whole(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    header = {"format": "hivenet-ledger", "version": 1, "run_id": RUN, "receipts": 1, "exported_at": 0}
    path.write_text(json.dumps(header) + "\n" + '{"receipt": "' + "A" * 100_000 + '"}\n')
    report = audit_export(path)
    assert len(report.invalid) == 1 and "longer" in report.invalid[0][1]


def test_an_audited_intake_admits_expired_receipts_that_were_valid_when_issued(tmp_path: Path) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    old = make.training(key, worker, issued_at=time.time() - 40 * 86400)
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        assert "expired" in ledger.add_many([old]).refused[0][1]
        assert ledger.add_many([old], audit=True).added == 1
        assert ledger.add_many([old], audit=True).duplicates == 1


def test_concurrent_batches_of_the_same_receipts_store_each_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    key, _ = new_peer()
    _, worker = new_peer()
    batch = [make.seed(key, worker) for _ in range(200)]
    with Ledger(tmp_path / "l.db", RUN) as ledger, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ledger.add_many, [batch] * 4))
        assert sum(r.added for r in results) == 200
        assert sum(r.duplicates for r in results) == 600
        assert len(ledger) == 200


def test_a_reader_sees_receipts_of_peers_another_connection_stored_since_it_opened(tmp_path: Path) -> None:
    """A dashboard or CLI reads the ledger a node's process keeps writing (failed with KeyError)."""
    path = tmp_path / "shared.db"
    key, _ = new_peer()
    _, worker = new_peer()
    with Ledger(path, RUN) as reader:
        with Ledger(path) as writer:
            writer.add(fresh := make.verdict(key, worker))
        assert [r.contributor for r in reader.receipts()] == [worker]
        assert [r.signer for r in reader.receipts(contributor=worker)] == [peer_id_from_private_key(key)]
        got = reader.get(receipt_id(fresh))
        assert got is not None and got.contributor == worker


def test_two_connections_can_both_store_receipts_of_the_same_new_peer(tmp_path: Path) -> None:
    """A node's process and a dashboard write one file: each may meet a peer the other just stored.

    Failed with `IntegrityError: UNIQUE constraint failed: peers.peer_id` (CI, the dashboard test).
    """
    path = tmp_path / "shared.db"
    key, _ = new_peer()
    _, worker = new_peer()
    with Ledger(path, RUN) as first, Ledger(path) as second:
        assert first.add(make.verdict(key, worker))
        assert second.add(make.verdict(key, worker))
        assert len(first) == len(second) == 2
        assert {r.contributor for r in first.receipts()} == {worker}
        assert {r.contributor for r in second.receipts(contributor=worker)} == {worker}


def test_a_contributors_newest_receipts(tmp_path: Path) -> None:
    """What a node page reads from the ledger: the newest receipts, and the newest rejections with envelopes."""
    key, _ = new_peer()
    _, worker = new_peer()
    _, other = new_peer()
    reasons = ["stale", "sampling", "stale", "toploc_mantissa", "stale"]
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        ledger.add(make.verdict(key, other))
        stored = [make.verdict(key, worker, issued_at=time.time() - 100 + i) for i in range(3)]
        stored += [make.verdict(key, worker, accepted=False, reason=reason) for reason in reasons]
        stored.append(make.transfer(key, worker))
        for envelope in stored:
            ledger.add(envelope)
        mine = ledger.contributor_receipts(worker, newest=2)
        assert [r.receipt_id for r in mine.newest] == [receipt_id(e) for e in stored[:-3:-1]]
        assert [r.reason for r in mine.newest_rejected] == ["stale", "toploc_mantissa"]
        assert all(r.envelope and not r.accepted for r in mine.newest_rejected)
        nobody = ledger.contributor_receipts(new_peer()[1], newest=2)
        assert (nobody.newest, nobody.newest_rejected) == ([], [])


def test_validation_receipts_are_stored_with_their_own_kind_code_and_reload(tmp_path: Path) -> None:
    trainer_key, _ = new_peer()
    _, validator = new_peer()
    data = make.validation(trainer_key, validator, tokens=120, rollouts=2, group_hash=b"v" * 32)
    path = tmp_path / "l.db"
    with Ledger(path, RUN) as ledger:
        assert ledger.add_many([data, make.seed(trainer_key, validator)]).added == 2
    with sqlite3.connect(path) as raw:
        codes = [code for (code,) in raw.execute("SELECT kind FROM receipts ORDER BY seq")]
    assert codes == [5, 4]  # a new code; the existing kinds keep theirs
    with Ledger(path) as reopened:
        stored = reopened.get(receipt_id(data))
        assert stored is not None and stored.kind is ReceiptKind.VALIDATION
        assert (stored.contributor, stored.evidence) == (validator, b"v" * 32)
        assert (stored.tokens, stored.count) == (120, 2)
        assert stored.role == "validator"
