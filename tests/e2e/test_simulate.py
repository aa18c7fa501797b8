"""`hivenet simulate`: runs a converged local swarm and tears down every process it started,
both when its duration ends and when the user presses Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from node.swarm import wait_until
from tests.helpers.paths import REPO


def _tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (nodes run in sessions of their own, so follow the tree)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


def _start(*args: str, output: Path) -> subprocess.Popen[bytes]:
    with open(output, "wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "simulate", *args],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "160"},
        )


def test_simulate_converges_and_cleans_up_after_duration(tmp_path: Path) -> None:
    output = tmp_path / "out.txt"
    process = _start("--nodes", "2", "--duration", "20", output=output)
    assert wait_until(lambda: "swarm converged" in output.read_text(), timeout_s=180), output.read_text()
    started = _tree(process.pid)
    assert len(started) > 3  # the seed and two nodes, each with its DHT and p2pd
    assert process.wait(timeout=240) == 0, output.read_text()
    text = output.read_text()
    assert "swarm converged: 3 nodes see each other" in text and "all nodes stopped" in text
    assert wait_until(lambda: not _alive(started), timeout_s=30), _alive(started)


def test_ctrl_c_tears_down_everything(tmp_path: Path) -> None:
    output = tmp_path / "out.txt"
    process = _start("--nodes", "2", "--roles", "relay", output=output)
    try:
        assert wait_until(lambda: "swarm converged" in output.read_text(), timeout_s=180), output.read_text()
        started = _tree(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "all nodes stopped" in output.read_text()
    assert wait_until(lambda: not _alive(started), timeout_s=30), _alive(started)


def test_killed_harness_leaves_no_orphans(tmp_path: Path) -> None:
    """SIGKILL to `hivenet simulate` itself (no chance to clean up) must still take every node down."""
    output = tmp_path / "out.txt"
    process = _start("--nodes", "2", output=output)
    try:
        assert wait_until(lambda: "swarm converged" in output.read_text(), timeout_s=180), output.read_text()
        started = _tree(process.pid)
        assert len(started) > 3
        process.kill()
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert wait_until(lambda: not _alive(started), timeout_s=30), _alive(started)
