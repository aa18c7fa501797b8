"""The global --log-file and --log-format options reach the logging set-up of the command they
precede (the formats themselves are `tests/unit/node/test_logs.py`'s)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


@pytest.mark.usefixtures("restored_logging")
def test_a_command_logs_json_lines_into_the_log_file(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "node.log"
    args = ["--log-format", "json", "--log-file", str(log_file), "model", "info", str(tmp_path / "missing")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "Traceback" not in result.output  # no model there: a clear error
    logging.getLogger("node.test").warning("a line after the command set logging up")
    lines = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
    assert any(line["message"] == "a line after the command set logging up" for line in lines), lines
