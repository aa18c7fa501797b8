"""`--json` output of the commands, as a script reads it from `hivenet` run as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO


def test_identity_json_parses_and_follows_the_environment(tmp_path: Path) -> None:
    key = tmp_path / "k"
    shown = _hivenet("identity", "--create", "--json", env={"HIVENET_IDENTITY_PATH": str(key)})
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["key_file"] == str(key) and document["peer_id"].startswith("12D3KooW") and key.exists()


def test_doctor_json_is_one_document_with_every_check(tmp_path: Path) -> None:
    result = _hivenet("doctor", "--json", "--identity", str(tmp_path / "k"))
    assert result.returncode == 1  # no seeds given: that check fails
    document = json.loads(result.stdout)
    names = [check["name"] for check in document["checks"]]
    assert names[:2] == ["identity", "versions"] and "seeds" in names
    assert document["ok"] is False
    seeds = next(check for check in document["checks"] if check["name"] == "seeds")
    assert seeds["ok"] is False and "initial-peers" in seeds["detail"]


def _hivenet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip
