"""Every command's --help ends with examples, and every example parses with that command's options."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.examples import EXAMPLES
from cli.main import cli


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


COMMANDS = dict(_commands(cli))


def test_every_command_has_examples_and_no_example_names_a_missing_command() -> None:
    assert set(EXAMPLES) == set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_the_help_ends_with_examples_that_parse(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the files the examples name, as a user would have them
    for name in ("model.safetensors", "node.ledger.db", "receipts.jsonl", "audit.ledger.db"):
        (tmp_path / name).write_bytes(b"")
    result = CliRunner().invoke(cli, [*path.split(), "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    shown = result.output.split("Examples:\n", 1)[1].splitlines()
    assert [line.strip() for line in shown if line.strip()] == EXAMPLES[path]
    command = COMMANDS[path]
    for example in EXAMPLES[path]:
        words = shlex.split(example)
        assert words[: 1 + len(path.split())] == ["hivenet", *path.split()], example
        args = words[1 + len(path.split()) :]
        with command.make_context(path, list(args)) as ctx:  # raises on an unknown option or a bad value
            assert ctx.params is not None


def _groups(group: click.Group, prefix: str = "") -> Iterator[str]:
    yield prefix.strip()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _groups(command, f"{prefix}{name} ")


@pytest.mark.parametrize("path", sorted(_groups(cli)))
def test_a_group_help_ends_with_one_example_of_each_of_its_commands(path: str) -> None:
    result = CliRunner().invoke(cli, [*path.split(), "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    shown = [line.strip() for line in result.output.split("Examples:\n", 1)[1].splitlines() if line.strip()]
    below = [p for p in COMMANDS if p.startswith(f"{path} ") or not path]
    # one line per direct subcommand, each an example of a command under this group
    assert len(shown) == len({p[len(path) :].split()[0] for p in below})
    assert all(any(example in EXAMPLES[p] for p in below) for example in shown), shown
