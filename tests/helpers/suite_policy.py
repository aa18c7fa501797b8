"""The suite's policy on skips under CI: where CI runs, a test that would skip fails instead.

A pytest plugin (`tests/conftest.py` takes its hook; `-p tests.helpers.suite_policy` elsewhere).

CI must provide what a test needs (chromium, network namespaces, a cached corpus); a skip there
hides a missing install step behind a green run. Only a skip whose reason starts with one of
`CI_MAY_SKIP` passes, for what no CI machine of this project has at all (a GPU).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping

import pytest

CI_MAY_SKIP = ("needs a CUDA GPU",)
"""Reasons a skip may give under CI=true: what no CI machine of this project can have."""


def under_ci(environ: Mapping[str, str]) -> bool:
    return environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def refused_skip(reason: str, environ: Mapping[str, str]) -> str | None:
    """The failure text for a test that skipped with `reason`, or None where the skip may stand."""
    reason = reason.removeprefix("Skipped: ")
    if not under_ci(environ) or reason.startswith(CI_MAY_SKIP):
        return None
    return (
        f"skipped under CI=true, where every test must run: {reason}\n"
        "Install what it needs in .ci/run (or scripts/setup.sh), or, if no CI machine can ever have "
        f"it, skip with a reason that starts with one of {CI_MAY_SKIP}."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    refusal = refused_skip(reason, os.environ)
    if refusal is not None:
        report.outcome = "failed"
        report.longrepr = refusal
