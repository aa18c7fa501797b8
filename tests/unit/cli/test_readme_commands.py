"""Every `hivenet` command in the README's code blocks parses with the CLI as it is (issue 28).

The README is what a new user types; an option renamed or removed in the code must fail here, not
on their machine. Each command (backslash continuations joined, the trailing comment dropped) is
parsed by its click command, with the files it names present, as a user following the README
would have them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from cli.main import cli

README = Path(__file__).resolve().parents[3] / "README.md"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)


def readme_commands() -> list[str]:
    commands = []
    for block in FENCE.findall(README.read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("hivenet "):
                commands.append(line)
    return commands


def _resolve(words: list[str]) -> tuple[click.Command, list[str], str]:
    command: click.Command = cli
    path = []
    rest = words[1:]
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        path.append(rest[0])
        command = command.commands[rest[0]]
        rest = rest[1:]
    return command, rest, " ".join(path)


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("line", readme_commands())
def test_each_readme_command_parses(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("policy.json", "model.safetensors", "node.ledger.db"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "llama-tiny").mkdir()
    command, args, path = _resolve(shlex.split(line))
    assert not isinstance(command, click.Group), f"{line!r} names no command"
    with command.make_context(path, list(args)) as ctx:  # raises on an unknown option or a bad value
        assert ctx.params is not None
