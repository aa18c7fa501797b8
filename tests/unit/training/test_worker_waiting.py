"""An inference worker says what it waits for (no version, no validator, banned, stale), once each
time that changes, instead of waiting silently."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from node.rollouts.client import Receipt
from protocol import rollouts_pb2 as rpb
from training.rl_worker import InferenceWorker
from training.worker_groups import refusal_summary as _refusal


def _receipts(*reasons: str) -> list[Receipt]:
    return [Receipt(b"", rpb.RolloutVerdict(accepted=not reason, reason=reason)) for reason in reasons]


def test_a_submission_that_nothing_judged_on_its_merits_names_the_obstacle() -> None:
    banned = _refusal([("val1", _receipts("banned", "banned"), ""), ("val2", _receipts("banned"), "")])
    assert banned is not None and "banned by validator(s) val1, val2" in banned
    stale = _refusal([("val1", _receipts("stale", "stale"), "")])
    assert stale is not None and "stale" in stale
    assert _refusal([("val1", _receipts("", "stale"), "")]) is None  # one accepted: nothing in the way
    assert _refusal([("val1", _receipts("toploc_exponent"), "")]) is None  # judged: the group report says why
    wrong_size = [
        Receipt(b"", rpb.RolloutVerdict(reason="group_size", detail="8 rollouts, the run's groups hold 4"))
    ]
    refused = _refusal([("val1", wrong_size, "")])
    assert (
        refused is not None and "8 rollouts, the run's groups hold 4" in refused and "--group-size" in refused
    )


def test_the_worker_logs_each_change_of_what_it_waits_for_once(caplog: pytest.LogCaptureFixture) -> None:
    worker = SimpleNamespace(node=SimpleNamespace(short_id="w0"), waiting_for=None)
    with caplog.at_level(logging.INFO):
        for reason in ("no validator", "no validator", "no validator", None, None, "banned by x"):
            InferenceWorker._waiting(worker, reason)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "[w0] waiting: no validator",
        "[w0] no longer waiting (no validator)",
        "[w0] waiting: banned by x",
    ]
    assert worker.waiting_for == "banned by x"
