"""`hivenet ledger`: export a ledger, verify the export offline, and see credit only from trusted signers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from click.testing import CliRunner
from hivemind.p2p import PeerID

from cli.main import cli
from node.ledger import Ledger
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer


def _b58(peer: bytes) -> str:
    return PeerID(peer).to_base58()


def _ledger_with_receipts(path: Path) -> dict[str, bytes]:
    """A validator credits a worker; a sybil credits a friend; returns the PeerIDs by name."""
    validator_key, validator = new_peer()
    sybil_key, sybil = new_peer()
    _, worker = new_peer()
    _, friend = new_peer()
    with Ledger(path, RUN) as ledger:
        result = ledger.add_many(
            [
                make.verdict(validator_key, worker, tokens=40),
                make.verdict(validator_key, worker, tokens=2),
                make.training(sybil_key, friend, tokens=10**6),
            ]
        )
        assert result.added == 3
    return {"validator": validator, "sybil": sybil, "worker": worker, "friend": friend}


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_export_then_verify_recomputes_credit_and_sybils_count_zero(tmp_path: Path) -> None:
    peers = _ledger_with_receipts(tmp_path / "l.db")
    out = tmp_path / "receipts.jsonl"
    code, output = _invoke("ledger", "export", "--db", str(tmp_path / "l.db"), "--out", str(out))
    assert code == 0 and "exported 3 receipts" in output, output

    code, output = _invoke("ledger", "verify", str(out), "--trusted", _b58(peers["validator"]), "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["ok"] and report["valid"] == 3 and report["run_id"] == RUN
    by_peer = {row["peer_id"]: row for row in report["contributors"]}
    worker = by_peer[_b58(peers["worker"])]
    assert worker["total"] == 42 and worker["roles"]["inference"]["total"] == 42
    friend = by_peer[_b58(peers["friend"])]
    assert friend["total"] == 0 and friend["untrusted"] == 10**6
    assert report["standing"]["untrusted"] == 1

    code, output = _invoke("ledger", "verify", str(out), "--trusted", _b58(peers["validator"]))
    assert code == 0, output
    assert "all receipts verify" in output and _b58(peers["worker"]) in output and "1 untrusted" in output


def test_verify_reports_a_tampered_receipt_and_exits_1(tmp_path: Path) -> None:
    peers = _ledger_with_receipts(tmp_path / "l.db")
    out = tmp_path / "receipts.jsonl"
    assert _invoke("ledger", "export", "--db", str(tmp_path / "l.db"), "--out", str(out))[0] == 0
    lines = out.read_text().splitlines()
    envelope = bytearray(base64.b64decode(json.loads(lines[1])["receipt"]))
    envelope[-1] ^= 0x01  # the last byte of the signature
    lines[1] = json.dumps({"receipt": base64.b64encode(bytes(envelope)).decode()})
    out.write_text("\n".join(lines) + "\n")

    code, output = _invoke("ledger", "verify", str(out), "--trusted", _b58(peers["validator"]), "--json")
    assert code == 1
    report = json.loads(output)
    assert not report["ok"] and report["valid"] == 2
    assert report["invalid"][0]["line"] == 2 and "signature" in report["invalid"][0]["reason"]
    code, output = _invoke("ledger", "verify", str(out))
    assert code == 1 and "line 2" in output and "does not fully verify" in output


def test_credit_from_a_ledger_and_bad_trusted_peer_id(tmp_path: Path) -> None:
    peers = _ledger_with_receipts(tmp_path / "l.db")
    code, output = _invoke(
        "ledger", "credit", "--db", str(tmp_path / "l.db"), "--trusted", _b58(peers["validator"])
    )
    assert code == 0 and "inference" in output and _b58(peers["worker"]) in output, output
    code, output = _invoke("ledger", "credit", "--db", str(tmp_path / "l.db"), "--trusted", "not-a-peer")
    assert code == 2 and "not an Ed25519 PeerID" in output


def test_import_an_export_into_a_new_ledger(tmp_path: Path) -> None:
    peers = _ledger_with_receipts(tmp_path / "a.db")
    out = tmp_path / "receipts.jsonl"
    assert _invoke("ledger", "export", "--db", str(tmp_path / "a.db"), "--out", str(out))[0] == 0
    code, output = _invoke("ledger", "import", str(out), "--db", str(tmp_path / "b.db"))
    assert code == 0 and "imported 3 receipts" in output, output
    code, output = _invoke("ledger", "import", str(out), "--db", str(tmp_path / "b.db"))
    assert code == 0 and "imported 0 receipts" in output and "3 already there" in output

    lines = out.read_text().splitlines()
    out.write_text("\n".join([*lines[:2], '{"receipt": 5}', *lines[2:]]) + "\n")
    code, output = _invoke("ledger", "import", str(out), "--db", str(tmp_path / "c.db"))
    assert code == 1 and "line 3 refused" in output and "imported 3 receipts" in output
    code, output = _invoke(
        "ledger", "credit", "--db", str(tmp_path / "c.db"), "--trusted", _b58(peers["validator"]), "--json"
    )
    totals = {row["peer_id"]: row["total"] for row in json.loads(output)["contributors"]}
    assert totals[_b58(peers["worker"])] == 42


def test_signers_by_role_a_validator_named_as_trainer_earns_its_workers_nothing(tmp_path: Path) -> None:
    peers = _ledger_with_receipts(tmp_path / "l.db")
    db = str(tmp_path / "l.db")

    def worker_total(*options: str) -> float:
        code, output = _invoke("ledger", "credit", "--db", db, *options, "--json")
        assert code == 0, output
        totals = {row["peer_id"]: row["total"] for row in json.loads(output)["contributors"]}
        return totals[_b58(peers["worker"])]

    assert worker_total("--validator", _b58(peers["validator"])) == 42
    assert worker_total("--trainer", _b58(peers["validator"])) == 42  # a trainer validates too
    # the flags the run's nodes name the same signers with
    assert worker_total("--trusted-validator", _b58(peers["validator"])) == 42
    assert worker_total("--publisher", _b58(peers["validator"])) == 42
    # the sybil named as a validator: its training receipt for its friend still counts zero
    code, output = _invoke("ledger", "credit", "--db", db, "--validator", _b58(peers["sybil"]), "--json")
    friend = next(r for r in json.loads(output)["contributors"] if r["peer_id"] == _b58(peers["friend"]))
    assert friend["total"] == 0 and friend["untrusted"] == 10**6
    code, output = _invoke("ledger", "credit", "--db", db, "--validator", "bob")
    assert code == 2 and "--validator" in output and "not an Ed25519 PeerID" in output


def test_the_credit_table_shows_abandoned_tickets_beside_other_rejections(tmp_path: Path) -> None:
    validator_key, validator = new_peer()
    _, worker = new_peer()
    with Ledger(tmp_path / "a.db", RUN) as ledger:
        ledger.add_many(
            [
                make.verdict(validator_key, worker, tokens=40),
                *(
                    make.verdict(validator_key, worker, tokens=0, accepted=False, reason="abandoned")
                    for _ in range(3)
                ),
                make.verdict(validator_key, worker, tokens=5, accepted=False, reason="stale"),
            ]
        )
    db = str(tmp_path / "a.db")
    code, output = _invoke("ledger", "credit", "--db", db, "--validator", _b58(validator), "--json")
    row = json.loads(output)["contributors"][0]
    assert code == 0 and row["rejected"] == {"abandoned": 3, "stale": 1}
    code, output = _invoke("ledger", "credit", "--db", db, "--validator", _b58(validator))
    assert code == 0 and "abandoned" in output
    line = next(line for line in output.splitlines() if _b58(worker)[:12] in line)
    cells = [cell.strip() for cell in line.strip().strip("│|").split("│")]
    assert cells[-2:] == ["1", "3"], line  # rejected for other reasons, abandoned


def test_validation_receipts_count_in_the_validator_column_only_from_the_runs_trainers(
    tmp_path: Path,
) -> None:
    trainer_key, trainer = new_peer()
    validator_key, validator = new_peer()
    _, standalone = new_peer()
    with Ledger(tmp_path / "l.db", RUN) as ledger:
        ledger.add_many(
            [
                make.validation(trainer_key, standalone, tokens=400),
                make.validation(validator_key, standalone, tokens=400),  # a validator is no trainer
            ]
        )
    run = ("--db", str(tmp_path / "l.db"), "--trainer", _b58(trainer), "--validator", _b58(validator))
    code, output = _invoke("ledger", "credit", *run, "--json")
    assert code == 0, output
    [row] = [r for r in json.loads(output)["contributors"] if r["peer_id"] == _b58(standalone)]
    assert row["roles"]["validator"]["total"] == row["total"] == 100
    assert row["roles"]["validator"]["untrusted"] == 100
    code, output = _invoke("ledger", "credit", *run)
    assert code == 0 and "seed ┃ validator ┃ total" in output, output
