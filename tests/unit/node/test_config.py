"""Configuration: precedence flags > HIVENET_* environment > file > defaults, unknown keys, malformed addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import NodeConfig, load_config
from protocol.errors import ConfigError

SEED = "/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWJUW8TJkrraxJRkC9EqBfTAGLumGNHJczTAy783LYjpkV"


def test_precedence(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text(
        f'public_name = "from-file"\nrun_id = "file-run"\ninitial_peers = ["{SEED}"]\nport = 4000\n'
    )
    defaults = load_config()
    assert defaults.run_id == "default" and defaults.port == 0
    from_file = load_config(config_file)
    assert (from_file.public_name, from_file.run_id, from_file.port) == ("from-file", "file-run", 4000)
    flagged = load_config(config_file, run_id="flag-run", port=None)
    assert (flagged.public_name, flagged.run_id, flagged.port) == ("from-file", "flag-run", 4000)
    assert flagged.initial_peers == [SEED]


def test_unknown_keys_are_an_error(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('publik_name = "typo"\n')
    with pytest.raises(ConfigError, match="publik_name: unknown setting"):
        load_config(config_file)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "address",
    [
        "garbage",
        "/ip4/127.0.0.1/tcp/31337",
        "/ip4/999.1.1.1/tcp/1/p2p/x",
        "12D3KooWJUW8TJkrraxJRkC9EqBfTAGLumGNHJ",
    ],
)
def test_malformed_initial_peer_shows_expected_form(address: str) -> None:
    with pytest.raises(ConfigError, match=r"/ip4/203\.0\.113\.5/tcp/31337/p2p/"):
        load_config(initial_peers=[address])


def test_refresh_must_be_shorter_than_ttl() -> None:
    with pytest.raises(ConfigError, match="refresh_interval_s"):
        load_config(record_ttl_s=10, refresh_interval_s=20)


OTHER_SEED = "/ip4/127.0.0.2/tcp/31338/p2p/12D3KooWJUW8TJkrraxJRkC9EqBfTAGLumGNHJczTAy783LYjpkV"


def test_environment_sits_between_the_file_and_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('run_id = "file-run"\nport = 4000\npublic_name = "from-file"\n')
    monkeypatch.setenv("HIVENET_RUN_ID", "env-run")
    monkeypatch.setenv("hivenet_port", "5000")  # any case
    monkeypatch.setenv("HIVENET_STATUS_PORT", "9100")
    from_env = load_config(config_file)
    assert (from_env.run_id, from_env.port, from_env.status_port) == ("env-run", 5000, 9100)
    assert from_env.public_name == "from-file"  # not set in the environment: the file's value stays
    flagged = load_config(config_file, run_id="flag-run", port=None)
    assert (flagged.run_id, flagged.port) == ("flag-run", 5000)


def test_lists_from_the_environment_are_json_or_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVENET_INITIAL_PEERS", f"{SEED}, {OTHER_SEED}")
    assert load_config().initial_peers == [SEED, OTHER_SEED]
    monkeypatch.setenv("HIVENET_INITIAL_PEERS", f'["{OTHER_SEED}"]')
    assert load_config().initial_peers == [OTHER_SEED]
    monkeypatch.setenv("HIVENET_INITIAL_PEERS", "")  # empty: as if unset
    assert load_config().initial_peers == []


def test_a_bad_environment_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVENET_PORT", "eighty")
    with pytest.raises(ConfigError, match=r"HIVENET_\* variables and flags\):\n  port: .*integer"):
        load_config()
    monkeypatch.delenv("HIVENET_PORT")
    monkeypatch.setenv("HIVENET_INITIAL_PEERS", "[not json")
    with pytest.raises(ConfigError, match="HIVENET_"):
        load_config()


def test_the_trainer_table_of_the_file_is_not_a_node_setting(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('run_id = "r"\n[trainer]\ninner_steps = 7\n')
    assert load_config(config_file).run_id == "r"


def test_nodes_with_their_own_keys_never_share_state_by_default(tmp_path: Path) -> None:
    from node.config import default_ledger_path, node_state_dir

    worker, trainer = (NodeConfig(identity_path=tmp_path / f"{name}.key") for name in ("worker", "trainer"))
    assert worker.weights_dir == tmp_path / "worker-state" / "weights"
    assert trainer.weights_dir == tmp_path / "trainer-state" / "weights"
    assert default_ledger_path(worker.identity_path, "r") != default_ledger_path(trainer.identity_path, "r")
    assert default_ledger_path(worker.identity_path, "r").parent.parent == node_state_dir(
        worker.identity_path
    )
    given = NodeConfig(identity_path=tmp_path / "worker.key", weights_dir=tmp_path / "shared")
    assert given.weights_dir == tmp_path / "shared"  # told to share: they do
