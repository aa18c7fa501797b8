"""DiLoCo through the command line: `hivenet join --role trainer` nodes train together on a
local swarm, and `hivenet simulate --trainers N` runs a whole run and prints the loss table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from node.swarm import LocalSwarm, wait_until

REPO = Path(__file__).resolve().parents[2]
# both trainers start once they see each other, and every round waits for both of them
TOGETHER = ["--wait-for-trainers", "2", "--target-group-size", "2", "--matchmaking-time", "30"]
TINY = ["--outer-steps", "2", "--inner-steps", "5", "--seq-len", "32", "--batch-size", "4"]


def test_two_trainer_nodes_train_together_and_leave(tmp_path: Path) -> None:
    with LocalSwarm(run_id="cli-train") as swarm:
        swarm.start_seed()
        names = [
            swarm.add_node(
                roles=["trainer"], wait=False, extra_args=[*TINY, "--checkpoint-dir", str(tmp_path / n)]
            )
            for n in ("a", "b")
        ]
        nodes = [swarm.nodes[name] for name in names]
        assert wait_until(lambda: not any(node.alive for node in nodes), timeout_s=300), [
            n.log_tail() for n in nodes
        ]
        hashes = []
        for node in nodes:
            log = node.log_tail(200)
            assert node.process.returncode == 0, log
            assert re.search(r"outer step +2 \| .* \| peers 2 \|", log), log
            assert "left." in log
            hashes.append(re.findall(r"outer step 2 loss \S+ peers 2 hash (\w+)", log))
        assert hashes[0] and hashes[0] == hashes[1]  # both trainers hold the same outer state
        assert list((tmp_path / "a").iterdir()), "no checkpoint was written"


def test_simulate_trainers_prints_the_loss_per_outer_step() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", "--trainers", "2", *TINY],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loss per outer step" in result.stdout
    rows = re.findall(r"│ (\d+) +│ ([\d.]+) +│ (\d+) +│ (\w+)", result.stdout)
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(row[2] == "2" and row[3] == "yes" for row in rows), result.stdout
