"""The validator's replay memory across restarts: a rollout accepted before a restart is a replay after
it; versions too old to judge are forgotten; what is read back is bounded, and a file that cannot be
read back gives one clear warning and an empty memory, never a crash."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.rl_workers import zero_nonces
from tests.helpers.validator_setup import ALICE, GROUP, RUN, assert_group_rejected, reasons
from training.model import ModelConfig, TinyGPT
from verification.replay_memory import ReplayMemory
from verification.tickets import TicketBook
from verification.verifier_window import VerifierWindow

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _hash(i: int) -> bytes:
    return i.to_bytes(32, "big")


def test_a_rollout_accepted_before_a_restart_is_a_replay_after_it(
    make_validator, honest, tmp_path: Path
) -> None:
    def start():  # what a node keeps beside its weights, opened again as a restarted process does
        return make_validator(
            tickets=TicketBook(tmp_path / "tickets.db", run_id=RUN, nonces=zero_nonces),
            replays=ReplayMemory(tmp_path / "replays.db", run_id=RUN),
        )

    first = honest(0, 0)
    sealed, _ = start().judge_group(ALICE, first)
    assert reasons(sealed) == [""] * GROUP

    restarted = start()
    copied = honest(0, 1)
    copied.rollouts[2] = first.rollouts[0]  # in another assignment: only the replay memory knows it
    sealed, accepted = restarted.judge_group(ALICE, copied)
    assert_group_rejected(restarted, sealed, accepted, "replay")
    assert not restarted.bans.is_banned(ALICE)
    sealed, _ = restarted.judge_group(ALICE, honest(0, 2))  # and honest groups are judged as before
    assert reasons(sealed) == [""] * GROUP


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    return TinyGPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32))


def test_a_window_takes_back_each_versions_hashes_and_forgets_versions_too_old_to_judge(
    model: TinyGPT, tmp_path: Path
) -> None:
    path = tmp_path / "replays.db"
    window = VerifierWindow(async_level=1, memory=ReplayMemory(path, run_id=RUN))
    for version in (0, 1):
        window.add(version, model)
        window.remember_hashes(version, [_hash(10 * version), _hash(10 * version + 1)])

    restarted = VerifierWindow(async_level=1, memory=ReplayMemory(path, run_id=RUN))
    restarted.add(1, model)  # a restarted trainer holds the version it resumed at
    assert restarted.seen_hash(_hash(10)) and restarted.seen_hash(_hash(11))
    assert not restarted.seen_hash(_hash(0))  # version 0 is not held: stale anyway
    restarted.add(2, model)
    restarted.remember_hashes(2, [_hash(20)])
    restarted.add(3, model)  # versions 0 and 1 can never be judged again: forgotten on disk too

    again = VerifierWindow(async_level=1, memory=ReplayMemory(path, run_id=RUN))
    for version in (2, 3):
        again.add(version, model)
    assert again.seen_hash(_hash(20)) and not again.seen_hash(_hash(10))
    rows = sqlite3.connect(path).execute("SELECT DISTINCT version FROM accepted ORDER BY version").fetchall()
    assert rows == [(2,)]


def _unusable_files() -> list[tuple[str, Callable[[Path], None]]]:
    """(what each broken replays.db holds, how to make it)."""

    def rows(*values: tuple[object, object]) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            ReplayMemory(path, run_id=RUN).close()
            with sqlite3.connect(path) as db:
                db.executemany("INSERT INTO accepted VALUES (?, ?)", values)

        return write

    def run(path: Path) -> None:
        ReplayMemory(path, run_id="another-run").close()

    def garbage(path: Path) -> None:
        path.write_bytes(b"\x00garbage" * 512)

    return [
        ("not a database", garbage),
        ("belongs to run 'another-run'", run),
        ("malformed row", rows((0, b"short"))),
        ("malformed row", rows(("zero", _hash(1)))),
        ("malformed row", rows((-1, _hash(1)))),
        ("malformed row", rows((0, "text, not bytes" * 3))),
        ("more than 4 hashes", rows(*[(0, _hash(i)) for i in range(5)])),
    ]


def test_an_unusable_file_gives_a_clear_warning_and_an_empty_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for index, (why, make) in enumerate(_unusable_files()):
        path = tmp_path / f"replays-{index}.db"
        make(path)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            memory = ReplayMemory(path, run_id=RUN, max_hashes=4)
        [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert why in warning and "moved to" in warning, warning
        assert memory.recall(0) == set()
        assert path.with_name(path.name + ".unusable").exists()
        # the fresh file in its place works
        memory.remember(0, [_hash(1)])
        memory.close()
        assert ReplayMemory(path, run_id=RUN, max_hashes=4).recall(0) == {_hash(1)}


def test_writes_stop_at_the_limit_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "replays.db"
    memory = ReplayMemory(path, run_id=RUN, max_hashes=3)
    with caplog.at_level(logging.WARNING):
        memory.remember(0, [_hash(1), _hash(2)])
        memory.remember(0, [_hash(3), _hash(4)])
        memory.remember(0, [_hash(5)])
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    memory.forget_before(0)
    memory.close()
    # never more than it would read back: the file stays usable
    assert ReplayMemory(path, run_id=RUN, max_hashes=3).recall(0) == {_hash(1), _hash(2), _hash(3)}


def test_a_file_that_cannot_be_moved_aside_leaves_a_memory_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "replays.db"
    path.write_bytes(b"\x00garbage" * 512)

    def refuse(*_: object) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr("verification.replay_memory.os.replace", refuse)
    with caplog.at_level(logging.WARNING):
        memory = ReplayMemory(path, run_id=RUN)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "cannot be replaced" in warning and "read-only" in warning
    memory.remember(0, [_hash(1)])  # judging goes on, remembering in memory
    assert path.read_bytes() == b"\x00garbage" * 512
