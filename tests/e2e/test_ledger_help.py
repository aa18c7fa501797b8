"""`hivenet ledger --help` and its subcommands answer without importing torch or hivemind."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import REPO


def test_ledger_help_does_not_import_torch_or_hivemind() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom cli.main import cli\n"
        "for sub in (['ledger', '--help'], ['ledger', 'verify', '--help'], ['ledger', 'export', '--help']):\n"
        "    assert CliRunner().invoke(cli, sub).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'hivemind') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
