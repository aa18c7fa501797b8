"""Options shared by the commands: trainer options from file/env/flags, --log-level, --json."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import cli
from cli.output import setup_logging
from cli.train import build_trainer_config, resolve_trainer_options
from cli.weights import WeightsOptions, weights_options
from protocol.errors import ConfigError


def test_trainer_options_flag_over_environment_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text(
        'run_id = "r"\n[trainer]\ninner_steps = 7\nouter_lr = 0.5\ncompression = "int8"\ndata_paths = ["a.txt"]\n'
    )
    from_file = resolve_trainer_options(config_file, {})
    assert (from_file["inner_steps"], from_file["outer_lr"], from_file["compression"]) == (7, 0.5, "int8")
    assert from_file["data_paths"] == [Path("a.txt")]
    monkeypatch.setenv("HIVENET_TRAINER_INNER_STEPS", "9")
    monkeypatch.setenv("HIVENET_TRAINER_BATCH_SIZE", "4")
    from_env = resolve_trainer_options(config_file, {"inner_steps": None, "data_paths": ()})
    assert (from_env["inner_steps"], from_env["batch_size"], from_env["outer_lr"]) == (9, 4, 0.5)
    assert from_env["data_paths"] == [Path("a.txt")]  # an absent repeatable flag keeps the file's list
    flagged = resolve_trainer_options(config_file, {"inner_steps": 11})
    assert (flagged["inner_steps"], flagged["batch_size"]) == (11, 4)


def test_bad_trainer_options_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text("[trainer]\ninner_stepz = 7\n")
    with pytest.raises(ConfigError, match=r"inner_stepz: unknown setting \(known: .*inner_steps"):
        resolve_trainer_options(config_file, {})
    monkeypatch.setenv("HIVENET_TRAINER_COMPRESSION", "zip")
    with pytest.raises(ConfigError, match="compression"):
        resolve_trainer_options(None, {})


def test_a_trainers_publishers_are_checked_peer_ids(tmp_path: Path) -> None:
    from node.identity import create_identity

    peer = create_identity(tmp_path / "key").peer_id.to_base58()
    config = build_trainer_config("r", authorized_publishers=[peer])
    assert config.authorized_publishers == [peer]
    assert build_trainer_config("r", authorized_publishers=None).authorized_publishers == []
    with pytest.raises(ConfigError, match=r"authorized_publishers.*not a base58 PeerID"):
        build_trainer_config("r", authorized_publishers=["not a peer"])


def test_the_sparse_codec_and_the_group_size_are_trainer_options(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('[trainer]\ncompression = "sparse"\nsparse_density = 0.02\nmax_group_size = 8\n')
    options = resolve_trainer_options(config_file, {})
    config = build_trainer_config("r", **options)
    assert (config.compression, config.sparse_density, config.max_group_size) == ("sparse", 0.02, 8)
    with pytest.raises(ConfigError, match=r"compression"):
        build_trainer_config("r", compression="fp16")


def test_a_config_naming_the_removed_all_reduce_averager_gets_a_clear_error(tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('[trainer]\naverager = "allreduce"\n')
    with pytest.raises(ConfigError, match=r"averager"):
        resolve_trainer_options(config_file, {})


class LevelProbe:
    """The real `hivenet` group with one more command that sets up logging like the others and
    records the root level it got. Levels are compared as numbers: importing hivemind renames
    level 30 to "WARN" for the whole process, so a level's name depends on what ran before."""

    def __init__(self) -> None:
        self.levels: list[int] = []

        @click.command("probe")
        @click.option("-v", "--verbose", is_flag=True)
        def probe(verbose: bool) -> None:
            setup_logging(verbose)
            self.levels.append(logging.getLogger().level)

        self.group = click.Group("hivenet", params=cli.params, commands={**cli.commands, "probe": probe})

    def level(self, *args: str, env: dict[str, str] | None = None) -> int:
        result = CliRunner().invoke(self.group, list(args), env=env)
        assert result.exit_code == 0, result.output
        return self.levels.pop()


@pytest.fixture
def probe_group() -> Iterator[LevelProbe]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield LevelProbe()
    root.setLevel(level)
    root.handlers[:] = handlers


def test_global_log_level_option_and_environment(probe_group: LevelProbe) -> None:
    import hivemind  # noqa: F401  (renames level 30 "WARN" for the process: the names must not matter)

    assert probe_group.level("probe") == logging.INFO
    assert probe_group.level("probe", "-v") == logging.DEBUG
    assert probe_group.level("--log-level", "error", "probe") == logging.ERROR
    assert probe_group.level("--log-level", "WARNING", "probe") == logging.WARNING
    assert probe_group.level("probe", env={"HIVENET_LOG_LEVEL": "debug"}) == logging.DEBUG
    assert (
        probe_group.level("--log-level", "error", "probe", env={"HIVENET_LOG_LEVEL": "debug"})
        == logging.ERROR
    )
    bad = CliRunner().invoke(probe_group.group, ["--log-level", "loud", "probe"])
    assert bad.exit_code == 2 and "loud" in bad.output and not probe_group.levels


def test_every_command_that_prints_state_offers_json() -> None:
    runner = CliRunner()
    for command in (["identity"], ["peers"], ["doctor"], ["weights", "status"]):
        assert "--json" in runner.invoke(cli, [*command, "--help"]).output, command


def test_rl_options_build_the_run_config_and_bad_values_are_clear_errors() -> None:
    from cli.rl import build_rl_config

    config = build_rl_config("r", groups_per_submission=3, async_level=1, group_size=None)
    assert (config.groups_per_submission, config.grpo.async_level) == (3, 1)
    assert build_rl_config("r").groups_per_submission == 2
    with pytest.raises(ConfigError, match="groups_per_submission"):
        build_rl_config("r", groups_per_submission=9)
    result = CliRunner().invoke(cli, ["simulate", "--rl", "--groups-per-submission", "0"])
    assert result.exit_code != 0 and "groups_per_submission" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_rl_demo_summarises_learning_by_quarters() -> None:
    from cli.rl import learning_summary

    assert learning_summary([0.1, 0.2]) == "2 trainer steps: too few to compare the start with the end"
    line = learning_summary([0.1, 0.1, 0.3, 0.3, 0.2, 0.2, 0.5, 0.3])
    assert line == "mean reward of steps 0-1: 0.100; of the last 2: 0.400 (+0.300: the policy learned)"
    assert "did not improve" in learning_summary([0.5, 0.4, 0.3, 0.2])


def test_an_rl_trainer_announces_the_validator_it_runs() -> None:
    from cli.rl import rl_node_roles
    from protocol.node_record import Role

    assert rl_node_roles([Role.TRAINER]) == [Role.TRAINER, Role.VALIDATOR]
    assert rl_node_roles([Role.TRAINER, Role.VALIDATOR]) == [Role.TRAINER, Role.VALIDATOR]
    assert rl_node_roles([Role.INFERENCE]) == [Role.INFERENCE]


def test_every_option_the_doctor_advises_exists_on_join() -> None:
    import re

    import cli.doctor
    from cli.node_commands import join

    advised = set(re.findall(r"--[a-z][a-z-]*", Path(cli.doctor.__file__).read_text()))
    offered = {name for param in join.params for name in getattr(param, "opts", [])}
    assert "--auto-relay" in advised and advised <= offered, advised - offered


def test_auto_relay_is_off_unless_asked_for_and_a_flag_does_not_override_the_file(tmp_path: Path) -> None:
    from cli.node_commands import _build_config

    assert _build_config(None, use_auto_relay=None).use_auto_relay is False
    assert _build_config(None, use_auto_relay=True).use_auto_relay is True
    config_file = tmp_path / "node.toml"
    config_file.write_text("use_auto_relay = true\n")
    assert _build_config(config_file, use_auto_relay=None).use_auto_relay is True


def test_the_task_help_names_the_run_configs_default_task() -> None:
    from cli.node_commands import join, simulate
    from cli.rl import build_rl_config
    from training.rl_run import RLRunConfig

    default = RLRunConfig.model_fields["task"].default
    for command in (join, simulate):
        (option,) = [param for param in command.params if param.name == "task"]
        assert option.help is not None and option.help.startswith(f"RL task: {default} (default),"), (
            option.help
        )
        with command.make_context(command.name or "", []) as ctx:
            assert ctx.params["task"] is None  # an absent --task leaves the run config's default
    assert build_rl_config("r").task == default


def test_the_torch_free_task_names_are_the_registrys() -> None:
    """`hivenet --help` must not import torch, so the CLI names the tasks from `training.task_names`."""
    from training.task_names import BUILTIN_TASK_NAMES
    from training.tasks.registry import BUILTIN_TASKS

    assert set(BUILTIN_TASK_NAMES) == set(BUILTIN_TASKS)


def test_the_weights_commands_dial_the_private_networks_they_are_told_to() -> None:
    # `hivenet weights fetch` in a lab or on a LAN could not reach a publisher at a private address.
    seen: list[WeightsOptions] = []

    @click.command()
    @weights_options
    def probe(options: WeightsOptions) -> None:
        seen.append(options)

    result = CliRunner().invoke(probe, ["--run", "lab", "--dialable-network", "10.77.0.0/16"])
    assert result.exit_code == 0, result.output
    assert seen[0].node_config().dialable_networks == ["10.77.0.0/16"]
    assert CliRunner().invoke(probe, ["--run", "lab"]).exit_code == 0
    assert seen[1].node_config().dialable_networks == []
