"""DiLoCo through the command line: a `hivenet join --role trainer` node trains, checkpoints and
leaves cleanly, and `hivenet simulate --trainers N` runs a whole multi-trainer run and prints
the loss table (all trainers averaging together, identical states)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from node.swarm import LocalSwarm, wait_until

REPO = Path(__file__).resolve().parents[2]
TINY = ["--outer-steps", "2", "--inner-steps", "5", "--seq-len", "32", "--batch-size", "4"]


def test_trainer_node_trains_checkpoints_and_leaves(tmp_path: Path) -> None:
    with LocalSwarm(run_id="cli-train") as swarm:
        swarm.start_seed()
        name = swarm.add_node(
            roles=["trainer"], wait=False, extra_args=[*TINY, "--checkpoint-dir", str(tmp_path)]
        )
        node = swarm.nodes[name]
        assert wait_until(lambda: not node.alive, timeout_s=300), node.log_tail()
        log = node.log_tail(200)
        assert node.process.returncode == 0, log
        assert re.search(r"outer step +1 \| .* \| loss [\d.]+ \| peers 1 \|", log), log
        assert re.search(r"outer step +2 \| .* \| tokens 1,280", log), (
            log
        )  # 5 steps x 4 x 32 tokens per round
        assert "left." in log
        assert sorted(p.name for p in tmp_path.iterdir())[-1] == "outer-00000002.safetensors"


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
