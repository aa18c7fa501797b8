"""The CI skip policy as CI meets it: a pytest run with CI=true fails a test that skips for a missing
tool and keeps one that skips for a GPU, while the same run without CI passes both as skipped."""

from __future__ import annotations

import pytest

from tests.helpers.paths import REPO

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest

def test_needs_a_missing_tool():
    pytest.skip("needs Debian's chromium (apt-get install -y chromium)")

def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU (none here)")
"""


@pytest.mark.parametrize(("ci", "outcomes"), [("true", {"failed": 1, "skipped": 1}), ("", {"skipped": 2})])
def test_ci_fails_a_skip_for_a_missing_tool(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcomes: dict[str, int]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_skipping=SKIPPING)
    result = pytester.runpytest_subprocess("-p", "tests.helpers.suite_policy", "-p", "no:cacheprovider")
    result.assert_outcomes(**outcomes)
    if ci:
        result.stdout.fnmatch_lines(["*skipped under CI=true, where every test must run*chromium*"])
