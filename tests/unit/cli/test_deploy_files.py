"""The operator files in deploy/ stay true to the code: the example config names every setting with a
valid value, the systemd unit and the Dockerfile run the node the way the README says."""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from pathlib import Path

from cli.train import TrainerOptions
from node.config import TRAINER_TABLE, NodeConfig, load_config

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "config.toml"


def _uncommented(text: str) -> str:
    """The example with every commented `key = value` line (and its trailing comment) made live."""
    lines = []
    for line in text.splitlines():
        match = re.fullmatch(r"# ([a-z_]+ = .+?)(\s+#.*)?", line)
        lines.append(match.group(1) if match else line)
    return "\n".join(lines)


def test_the_example_config_names_every_setting_with_a_value_the_node_accepts(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    config = load_config(EXAMPLE)
    assert config.port == 31337 and config.status_port == 8790
    everything = tmp_path / "all.toml"
    everything.write_text(_uncommented(text))
    values = tomllib.loads(everything.read_text())
    assert set(values) - {TRAINER_TABLE} == set(NodeConfig.model_fields)
    assert set(values[TRAINER_TABLE]) == set(TrainerOptions.model_fields)
    load_config(everything)
    TrainerOptions(**values[TRAINER_TABLE])
    lines = text.splitlines()
    for (
        key
    ) in NodeConfig.model_fields:  # each setting, or the block of settings it is in, has a comment above
        at = next(i for i, line in enumerate(lines) if re.match(rf"(# )?{key} = ", line))
        while at > 0 and re.match(r"(# )?[a-z_]+ = ", lines[at - 1]):
            at -= 1
        assert at > 0 and lines[at - 1].startswith("# "), key


def test_the_systemd_unit_runs_join_on_the_example_config_and_stops_it_cleanly() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "hivenet.service")
    service = unit["Service"]
    command = shlex.split(service["ExecStart"])
    assert command[0].endswith("/hivenet") and command[1] == "join"
    assert command[command.index("--config") + 1] == "/etc/hivenet/config.toml"
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert service["User"] not in ("", "root")
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "SIGTERM" in (REPO / "node" / "shutdown.py").read_text()  # the node leaves cleanly on it


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = dockerfile.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_the_dockerfile_installs_the_pinned_cpu_torch_and_runs_the_node_unprivileged() -> None:
    steps = _instructions(DEPLOY / "Dockerfile")
    ops = [op for op, _ in steps]
    assert ops[0] == "FROM" and "python:3.11" in steps[0][1]
    for op, rest in steps:
        if op == "COPY":
            *sources, _ = rest.split()
            assert all((REPO / source).exists() for source in sources), rest
    pin = re.search(r"^torch==(\S+)", (REPO / "constraints.txt").read_text(), re.M)
    run = " ".join(rest for op, rest in steps if op == "RUN")
    assert pin and f"torch=={pin.group(1)}" in run and "whl/cpu" in run
    user = max(i for i, op in enumerate(ops) if op == "USER")
    assert steps[user][1] not in ("root", "0") and user < ops.index("ENTRYPOINT")
    config = load_config(EXAMPLE)
    assert f"EXPOSE {config.port}" in [f"{op} {rest}" for op, rest in steps]
    health = dict(steps)["HEALTHCHECK"]
    assert f"127.0.0.1:{config.status_port}/health" in health
    copied = [rest.split() for op, rest in steps if op == "COPY" and rest.startswith("deploy/config.toml")]
    assert copied and copied[0][-1] == "/etc/hivenet/config.toml"
    assert dict(steps)["ENTRYPOINT"] == '["hivenet"]' and "/etc/hivenet/config.toml" in dict(steps)["CMD"]
