"""`hivenet doctor` asks the seeds for a dial-back only where `hivenet join` does, and says why it
skipped one; its network probe is a fake here (no process, no socket)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cli.doctor import run_doctor
from node.dht_node import SeedStatus
from node.reachability import DialBackOutcome, wants_dial_back

SEED_ID = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
LOOPBACK_SEED = f"/ip4/127.0.0.1/tcp/31337/p2p/{SEED_ID}"
PUBLIC_SEED = f"/ip4/203.0.113.5/tcp/31337/p2p/{SEED_ID}"
REFUSED = DialBackOutcome(False, "JWoa: DIAL_BACK_BAD_REQUEST 127.0.0.1 is not a public address")


class FakeProbe:
    """The doctor's probe node: every seed answers, and a dial-back is refused as a seed on 0.0.0.0
    refuses a node on loopback."""

    made: list[FakeProbe] = []

    def __init__(self, config: Any, **_: Any) -> None:
        self.config = config
        self.seed_statuses: list[SeedStatus] = []
        self.dial_backs = 0
        FakeProbe.made.append(self)

    def start(self) -> None:
        self.seed_statuses = [SeedStatus(address, True) for address in self.config.initial_peers]

    def check_reachability(self) -> DialBackOutcome:
        self.dial_backs += 1
        return REFUSED

    def stop(self) -> None:
        pass


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run the doctor on `seeds` with the fake probe; (passed, its report as one line per check)."""
    for name in list(os.environ):
        if name.startswith("HIVENET_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr("node.node.HivenetNode", FakeProbe)
    FakeProbe.made.clear()

    def run(seeds: list[str]) -> tuple[bool, list[str]]:
        passed = run_doctor(
            initial_peers=seeds, identity_path=tmp_path / "node.key", timeout_s=1.0, host="127.0.0.1"
        )
        return passed, capsys.readouterr().out.splitlines()

    return run


def _dial_back_lines(report: list[str]) -> list[str]:
    return [line for line in report if line.split()[1:2] == ["dial-back"]]


def test_the_doctor_skips_the_dial_back_where_join_does_and_says_why(doctor: Any) -> None:
    assert not wants_dial_back("auto", [LOOPBACK_SEED])  # join's decision for this swarm
    _, report = doctor([LOOPBACK_SEED])
    (line,) = _dial_back_lines(report)
    assert line.split()[0] == "ok" and "skipped" in line and "every seed is on loopback" in line, line
    assert [probe.dial_backs for probe in FakeProbe.made] == [0]


def test_the_doctor_asks_for_the_dial_back_where_join_does(doctor: Any) -> None:
    assert wants_dial_back("auto", [PUBLIC_SEED])
    passed, report = doctor([PUBLIC_SEED])
    (line,) = _dial_back_lines(report)
    assert not passed and line.split()[0] == "FAIL" and REFUSED.detail in line, line
    assert [probe.dial_backs for probe in FakeProbe.made] == [1]


def test_off_a_terminal_the_report_keeps_each_check_on_one_line(
    doctor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS")  # a pipe or a journal: rich would wrap at 80 columns
    _, report = doctor([LOOPBACK_SEED])
    (line,) = _dial_back_lines(report)
    assert len(line) > 80 and line.endswith("needs no dial-back"), report
