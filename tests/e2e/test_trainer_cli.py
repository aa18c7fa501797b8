"""DiLoCo through the command line: a `hivenet join --role trainer` node trains, checkpoints and
leaves cleanly; two such nodes average every outer step together, end with the same state and sign
training receipts for each other into their ledgers;
and `hivenet simulate --trainers N` runs a whole multi-trainer run and prints the loss table
(all trainers averaging together, identical states)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.swarm import LocalSwarm, wait_until
from tests.helpers.paths import REPO

TINY = ["--outer-steps", "2", "--inner-steps", "5", "--seq-len", "32", "--batch-size", "4"]
PROGRESS = re.compile(r"outer step +(\d+) \| \S+ \| loss [\d.]+ \| peers (\d+) \|")
STATE = re.compile(r"outer step +(\d+) \|.*\| state (\w+)")


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
        assert len(re.findall(r"outer step +2\b", log)) == 1, log  # each step is shown once
        assert sorted(p.name for p in tmp_path.iterdir())[-1] == "outer-00000002.safetensors"
        # the last snapshot, written as the node left: its metrics counted the training
        status = node.status()
        assert status is not None and status.metrics.outer_steps == 2, status
        assert status.metrics.tokens == {"trainer": 1280} and status.metrics.train_loss is not None


@pytest.mark.timeout(900)
def test_two_trainer_nodes_average_together(tmp_path: Path) -> None:
    """Two `hivenet join --role trainer` processes keep meeting: however their speeds differ on a
    loaded machine, outer steps after the first are averaged by both, and both end in one state.

    Each names the other with `--publisher`: with no third trainer to confirm a state, that is
    what lets one that a reducer left out of part of a round (a dial in backoff on a loaded
    machine) take the other's state and converge again."""
    from hivemind.p2p import PeerID

    from node.identity import create_identity
    from node.ledger import Ledger
    from protocol.receipts import ReceiptKind

    outer_steps = 4
    args = [*TINY[2:], "--outer-steps", str(outer_steps), "--wait-for-trainers", "2"]
    keys = [tmp_path / f"trainer-{name}.key" for name in "ab"]
    peer_ids = [create_identity(key).peer_id.to_base58() for key in keys]
    with LocalSwarm(run_id="cli-train-two", workdir=tmp_path) as swarm:
        swarm.start_seed()
        nodes = []
        for key, other in zip(keys, reversed(peer_ids), strict=True):
            extra = [*args, "--publisher", other]
            name = swarm.add_node(roles=["trainer"], wait=False, identity_path=key, extra_args=extra)
            nodes.append(swarm.nodes[name])
        # Bounded, not timed: each round waits at most about 30 s for its peer before stepping alone.
        done = wait_until(lambda: not any(node.alive for node in nodes), timeout_s=720)
        logs = [node.log_file.read_text(errors="replace") for node in nodes]
        report = "\n\n".join(
            f"--- {n.name}\n" + "\n".join(log.splitlines()[-60:]) for n, log in zip(nodes, logs, strict=True)
        )
        assert done, report
    final_hashes = []
    for node, log in zip(nodes, logs, strict=True):
        assert node.process.returncode == 0, report
        peers = {int(step): int(n) for step, n in PROGRESS.findall(log)}
        assert sorted(peers) == list(range(1, outer_steps + 1)), report
        assert any(peers[step] == 2 for step in range(2, outer_steps + 1)), report
        hashes = dict(STATE.findall(log))
        final_hashes.append(hashes.get(str(outer_steps)))
    assert final_hashes[0] is not None and final_hashes[0] == final_hashes[1], report
    # each trainer signed training receipts for the other into its node's ledger
    trainers = {PeerID.from_base58(peer).to_bytes() for peer in peer_ids}
    signed = set()
    for node in nodes:
        with Ledger(tmp_path / f"{node.name}.ledger.db") as ledger:
            signed |= {(r.signer, r.contributor) for r in ledger.receipts() if r.kind == ReceiptKind.TRAINING}
    assert signed and all({signer, contributor} == trainers for signer, contributor in signed), report


def _weights_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "weights", *args, "--host", "127.0.0.1"],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip


def test_a_trainer_node_serves_the_versions_it_publishes(tmp_path: Path) -> None:
    """`hivenet join --role trainer` hosts the weight broadcast on its own runtime: each outer step is
    published as a version, `weights status` sees it and a fetcher downloads it from the trainer."""
    import torch
    from safetensors.torch import load_file

    from training.model import ModelConfig, TinyGPT

    # -v: each publication is a debug line (the progress line already shows the outer step). No
    # --outer-steps: the trainer trains (and serves) until the swarm stops it, however long the
    # fetch below takes on a loaded machine (a bounded run may end, and take its versions with it).
    args = ["--inner-steps", "3", "--seq-len", "32", "--batch-size", "2", "-v"]
    with LocalSwarm(run_id="cli-serve", workdir=tmp_path) as swarm:
        swarm.start_seed()
        node = swarm.nodes[swarm.add_node(roles=["trainer"], wait=True, extra_args=args)]
        published = re.compile(r"published version (\d+)")
        assert wait_until(lambda: published.search(node.log_tail(400)) is not None, timeout_s=300), (
            node.log_tail()
        )
        common = ["--run", "cli-serve", "--initial-peers", swarm.seed_multiaddr, "--publisher", node.peer_id]
        status = _weights_cli("status", *common)
        assert status.returncode == 0, status.stderr[-3000:]
        assert re.search(r"\b1\b", status.stdout), status.stdout
        fetched = _weights_cli("fetch", "--out", str(tmp_path / "out"), *common)
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        files = sorted((tmp_path / "out").glob("cli-serve-v*.safetensors"))
        assert files, fetched.stdout + fetched.stderr
        got = load_file(str(files[-1]))
        model = TinyGPT(ModelConfig())
        assert got.keys() == dict(model.named_parameters()).keys()
        assert all(torch.isfinite(tensor).all() for tensor in got.values())
        assert node.alive, node.log_tail()


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
