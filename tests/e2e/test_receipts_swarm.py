"""Receipts on a real local swarm (seed and `hivenet join` node as processes): every joined node serves
its ledger through the receipts exchange, and `hivenet dashboard` pulls it, so its leaderboard fills
without anyone importing a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hivemind.p2p import PeerID

from node.dashboard import peer_text
from node.ledger import Ledger
from node.swarm import LocalSwarm, wait_until
from protocol.receipts import ReceiptKind
from tests.helpers import receipts as make
from tests.helpers.paths import REPO
from tests.helpers.receipts import new_peer

ENV = {k: v for k, v in os.environ.items() if not k.startswith("HIVENET_")} | {"PYTHONPATH": str(REPO)}
RUN = "itest-receipts"


@pytest.fixture(scope="module")
def swarm() -> Iterator[LocalSwarm]:
    with LocalSwarm(run_id=RUN) as local:
        local.start(1)
        yield local


def _count(path: Path) -> int:
    with Ledger(path) as ledger:
        return len(ledger)


def _seed_receipt_contributors(path: Path) -> list[bytes]:
    with Ledger(path) as ledger:
        return [receipt.contributor for receipt in ledger.receipts() if receipt.kind == ReceiptKind.SEED]


def _leaderboard(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "api/leaderboard", timeout=10) as response:
        return {row["peer_id"]: row["total"] for row in json.loads(response.read())["rows"]}


def test_the_dashboard_pulls_a_joined_nodes_receipts_into_its_leaderboard(
    swarm: LocalSwarm, tmp_path: Path
) -> None:
    (node,) = swarm.nodes.values()
    signer, signer_id = new_peer()
    _, contributor = new_peer()
    # the node's own ledger: the receipt it signed for the seed of its bootstrap, and what its
    # roles would have signed, written while it runs
    with Ledger(swarm.workdir / f"{node.name}.ledger.db", RUN) as ledger:
        ledger.add_many([make.transfer(signer, contributor, run_id=RUN) for _ in range(3)])
    dashboard_ledger = tmp_path / "dashboard.db"
    process = subprocess.Popen(
        [
            sys.executable, "-m", "cli.main", "dashboard", "--run", RUN, "--initial-peers", swarm.seed_multiaddr,
            "--ledger", str(dashboard_ledger), "--port", "0", "--trusted", peer_text(signer_id),
            "--pull-every", "1", "--pull-max", "2",
        ],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = process.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.1:"), url
        board: dict[str, float] = {}

        def filled() -> bool:
            board.update(_leaderboard(url))
            return board.get(peer_text(contributor), 0) > 0 and _count(dashboard_ledger) == 4

        assert wait_until(filled, 60.0, interval_s=0.5), board
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert _count(dashboard_ledger) == 4  # cycles of at most two receipts each: the cursor resumed
    assert swarm.seed is not None
    seed = PeerID.from_base58(swarm.seed.peer_id).to_bytes()
    assert _seed_receipt_contributors(dashboard_ledger) == [seed]
