"""`hivenet dashboard` as a process: serves a ledger, refuses bad options cleanly, stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from node.dashboard import peer_text
from tests.helpers.dashboard import build_run
from tests.helpers.paths import REPO
from tests.helpers.receipts import RUN

ENV = {k: v for k, v in os.environ.items() if not k.startswith("HIVENET_")} | {"PYTHONPATH": str(REPO)}


def hivenet(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def test_dashboard_serves_a_ledger_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run, ledger = build_run(tmp_path / "ledger.db")
    ledger.close()
    trusted = [arg for peer in run.trusted for arg in ("--trusted", peer_text(peer))]
    process = subprocess.Popen(
        hivenet("dashboard", "--run", RUN, "--ledger", str(tmp_path / "ledger.db"), "--port", "0", *trusted),
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = process.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(url + "api/leaderboard", timeout=10) as response:
            board = json.loads(response.read())
        alice = next(row for row in board["rows"] if row["peer_id"] == peer_text(run.peers["alice"].peer_id))
        assert alice["total"] == 200
        with urllib.request.urlopen(url + "api/swarm", timeout=10) as response:
            assert json.loads(response.read())["connected"] is False
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "showing the ledger without the swarm" in stderr and "Traceback" not in stderr


def test_dashboard_refuses_a_bad_trusted_peer_and_a_ledger_of_another_run(tmp_path: Path) -> None:
    bad = subprocess.run(
        hivenet("dashboard", "--trusted", "not-a-peer", "--port", "0"),
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "is not an Ed25519 PeerID" in bad.stderr
    _, ledger = build_run(tmp_path / "ledger.db")
    ledger.close()
    other = subprocess.run(
        hivenet("dashboard", "--run", "another-run", "--ledger", str(tmp_path / "ledger.db"), "--port", "0"),
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 1 and "records run" in other.stderr and "Traceback" not in other.stderr
