"""The roles `hivenet join` gives a node: a validator judges the rollouts of an RL run, so one asked
for on another run is refused before anything starts, and the default role claims no validation there."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.examples import SEED, TRAINER
from cli.main import cli
from protocol.node_record import Role


class Started:
    """What `join` would have run: the config of each node it started (none is: no process, no socket)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.configs: list[Any] = []
        self.rl_configs: list[Any] = []

    def run(self, node: Any, label: str, **options: Any) -> None:
        self.configs.append(node)
        self.rl_configs.append(options["rl_config"])

    def join(self, *args: str, env: dict[str, str] | None = None) -> Result:
        identity = ["--identity", str(self.tmp_path / "node.key")]
        return CliRunner().invoke(cli, ["join", "--initial-peers", SEED, *identity, *args], env=env)


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Started]:
    for name in list(os.environ):
        if name.startswith("HIVENET_"):
            monkeypatch.delenv(name)
    recorder = Started(tmp_path)
    monkeypatch.setattr("node.node.HivenetNode", lambda config: config)
    monkeypatch.setattr("cli.node_commands.run_until_interrupted", recorder.run)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield recorder
    root.setLevel(level)
    root.handlers[:] = handlers


def _refused(result: Result) -> bool:
    return (
        result.exit_code == 2
        and "a validator judges the rollouts of an RL run" in result.output
        and "add --rl" in result.output
        and "Traceback" not in result.output
    )


@pytest.mark.parametrize("roles", [["validator"], ["trainer", "validator"]])
def test_a_validator_asked_for_on_a_run_that_is_not_rl_is_refused_before_the_node_starts(
    started: Started, roles: list[str]
) -> None:
    result = started.join(*(arg for role in roles for arg in ("--role", role)))
    assert _refused(result), result.output
    assert started.configs == []


def test_a_validator_from_the_config_file_or_the_environment_is_refused_like_the_flag(
    started: Started, tmp_path: Path
) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('roles = ["validator"]\n')
    assert _refused(started.join("--config", str(config_file)))
    assert _refused(started.join(env={"HIVENET_ROLES": "validator"}))
    assert started.configs == []


def test_a_plain_join_still_takes_part_as_a_relay_and_claims_no_validation(started: Started) -> None:
    result = started.join()
    assert result.exit_code == 0, result.output
    (config,) = started.configs
    assert config.roles == [Role.RELAY] and started.rl_configs == [None]


def test_on_an_rl_run_a_validator_is_accepted_and_remains_the_default(started: Started) -> None:
    for roles in (["--role", "validator"], []):
        result = started.join("--rl", "--publisher", TRAINER, *roles)
        assert result.exit_code == 0, result.output
    assert [config.roles for config in started.configs] == [[Role.VALIDATOR], [Role.VALIDATOR]]
    assert all(rl_config is not None for rl_config in started.rl_configs)
