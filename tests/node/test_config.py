"""Configuration: precedence flags > file > defaults, unknown keys, malformed addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import load_config
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
