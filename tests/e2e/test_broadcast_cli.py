"""Tests of `hivenet weights`: fast help without torch, and (slow) a real publish/fetch/status round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO as ROOT

WEIGHTS = "from cli.weights import weights; weights()"


def _cli(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WEIGHTS, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def test_help_lists_commands_without_importing_torch() -> None:
    probe = "import sys; from cli.weights import weights; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, timeout=60)
    result = _cli("--help")
    assert result.returncode == 0
    for command in ("publish", "fetch", "status"):
        assert command in result.stdout
    assert "--publisher" in _cli("fetch", "--help").stdout


def test_fetch_without_publisher_is_a_usage_error(tmp_path: Path) -> None:
    result = _cli("fetch", "--run", "r", "--out", str(tmp_path))
    assert result.returncode == 2 and "--publisher" in result.stderr


@pytest.mark.slow
def test_publish_fetch_status_round_trip(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from node.identity import create_identity

    weights_file = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(200, 300), "b": torch.arange(7)}, str(weights_file))
    publisher_id = create_identity(tmp_path / "pub.key").peer_id.to_base58()
    publisher = subprocess.Popen(
        [sys.executable, "-c", WEIGHTS, "publish", str(weights_file), "--run", "cli", "--version", "3",
         "--identity", str(tmp_path / "pub.key"), "--host", "127.0.0.1", "--chunk-bytes", "16384",
         "--serve-for", "120"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert publisher.stdout is not None
        address = publisher.stdout.readline().strip()  # the publisher prints its multiaddrs once serving
        assert address.endswith(publisher_id), address
        common = [
            "--run",
            "cli",
            "--initial-peers",
            address,
            "--publisher",
            publisher_id,
            "--host",
            "127.0.0.1",
        ]
        fetched = _cli("fetch", "--out", str(tmp_path / "out"), *common)
        assert fetched.returncode == 0, fetched.stderr
        got = load_file(str(tmp_path / "out" / "cli-v3.safetensors"))
        want = load_file(str(weights_file))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        status = _cli("status", "--store", str(tmp_path / "out" / ".store"), *common)
        assert status.returncode == 0, status.stderr
        assert "2/2" in status.stdout  # publisher and fetcher both hold the whole version
        as_json = _cli("status", "--json", "--store", str(tmp_path / "out" / ".store"), *common)
        assert as_json.returncode == 0, as_json.stderr
        [version] = json.loads(as_json.stdout)
        assert version["version"] == 3 and version["publisher"] == publisher_id
        assert version["local_chunks"] == version["num_chunks"] > 1
        assert len(version["holders"]) == 2
        assert all(holder["chunks_held"] == version["num_chunks"] for holder in version["holders"])
    finally:
        publisher.terminate()
        try:
            publisher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(publisher.pid, 9)
            publisher.wait()
