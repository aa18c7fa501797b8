"""CLI basics that need no swarm: fast help, clear errors for bad input, identity display."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO


def hivenet(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_help_does_not_import_torch_or_hivemind() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom cli.main import cli\n"
        "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "for sub in ('join', 'seed', 'peers', 'doctor', 'simulate', 'identity', 'weights'):\n"
        "    assert CliRunner().invoke(cli, [sub, '--help']).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'hivemind') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_multiaddr_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    result = hivenet("join", "--initial-peers", "not-an-address", "--identity", str(tmp_path / "k"))
    assert result.returncode != 0
    assert "/ip4/203.0.113.5/tcp/31337/p2p/" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_inference_worker_must_name_the_publisher_it_trusts(tmp_path: Path) -> None:
    result = hivenet("join", "--role", "inference", "--new-swarm", "--identity", str(tmp_path / "k"))
    assert result.returncode != 0 and "--publisher" in result.stderr
    assert "Traceback" not in result.stderr and "<Role" not in result.stderr


def test_a_publisher_that_is_not_a_peer_id_is_a_clear_error(tmp_path: Path) -> None:
    result = hivenet(
        "join",
        "--role",
        "inference",
        "--new-swarm",
        "--publisher",
        "alice",
        "--identity",
        str(tmp_path / "k"),
    )
    assert result.returncode != 0 and "'alice' is not a base58 PeerID" in result.stderr
    assert "Traceback" not in result.stderr


def test_join_without_seeds_needs_new_swarm(tmp_path: Path) -> None:
    result = hivenet("join", "--identity", str(tmp_path / "k"))
    assert result.returncode == 2 and "--new-swarm" in result.stderr and "--initial-peers" in result.stderr
    assert "Traceback" not in result.stderr


def test_simulate_with_an_unknown_role_is_a_usage_error() -> None:
    result = hivenet("simulate", "--roles", "foo,validator", "--duration", "1")
    assert result.returncode == 2 and "foo, validator cannot be simulated" in result.stderr
    assert "choose from trainer, relay" in result.stderr and "--rl" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_seed_help_states_its_default_port() -> None:
    assert "seed: 31337" in " ".join(hivenet("seed", "--help").stdout.split())


def test_identity_command(tmp_path: Path) -> None:
    missing = hivenet("identity", "--identity", str(tmp_path / "k"))
    assert missing.returncode == 1 and "no identity" in missing.stderr
    created = hivenet("identity", "--identity", str(tmp_path / "k"), "--create")
    assert created.returncode == 0 and "peer id:  12D3KooW" in created.stdout
    again = hivenet("identity", "--identity", str(tmp_path / "k"))
    assert again.stdout == created.stdout


def test_unknown_config_key_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("colour = 'blue'\n")
    result = hivenet("join", "--config", str(config), "--identity", str(tmp_path / "k"), "--new-swarm")
    assert result.returncode == 1 and "colour: unknown setting" in result.stderr
