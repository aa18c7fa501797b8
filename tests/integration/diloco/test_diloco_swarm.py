"""A DiLoCo run on loopback: every peer holds bit-identical parameters after every outer step;
a single trainer works; a restarted trainer resumes from its checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from node.dht_node import start_loopback_dht
from node.swarm import wait_until
from tests.helpers.trainers import (
    AVERAGING_MODES,
    averaging_mode,
    finished,
    harness,
    tiny_config,
)
from training.checkpoint import latest_checkpoint, load_checkpoint
from training.diloco import OuterStepReport
from training.simulation import simulate_diloco
from training.trainer import run_trainer


@pytest.mark.parametrize("mode", AVERAGING_MODES)
def test_three_trainers_agree_bit_for_bit_after_every_outer_step(mode: str) -> None:
    # Healthy rounds: generous timeouts, so that a trainer the loaded CI machine delays by a few
    # seconds is waited for rather than left out (partial rounds have their own test below).
    config = tiny_config(4, sender_timeout_s=15.0, averaging_timeout_s=60.0, **averaging_mode(mode))
    reports = simulate_diloco(3, config)
    by_step: dict[int, list[OuterStepReport]] = {}
    for r in reports:
        by_step.setdefault(r.outer_step, []).append(r)
    assert sorted(by_step) == [1, 2, 3, 4]
    for step, group in by_step.items():
        assert len(group) == 3
        assert len({r.outer_hash for r in group}) == 1, f"peers disagree after outer step {step}"
        assert all(r.num_peers == 3 for r in group)
    assert all(r.bytes_sent > 0 for r in reports)
    first = sum(r.train_loss for r in by_step[1]) / 3
    last = sum(r.train_loss for r in by_step[4]) / 3
    assert last < first


def test_single_trainer_runs_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    dht = start_loopback_dht()
    try:
        first: list[OuterStepReport] = []
        config = tiny_config(2, checkpoint_dir=directory, checkpoint_every_outer_steps=1)
        run_trainer(config, dht=dht, stop_event=threading.Event(), on_progress=first.append)
        assert [r.outer_step for r in first] == [1, 2] and all(r.num_peers == 1 for r in first)
        path = latest_checkpoint(directory)
        assert path is not None
        saved = load_checkpoint(path, run_id="test-run")
        assert saved.step == 2 and saved.hash() == first[-1].outer_hash

        second: list[OuterStepReport] = []
        run_trainer(tiny_config(4, checkpoint_dir=directory), dht=dht, stop_event=threading.Event(),
                    on_progress=second.append)  # fmt: skip
        assert [r.outer_step for r in second] == [3, 4]
        final = latest_checkpoint(directory)
        assert final is not None and load_checkpoint(final).hash() == second[-1].outer_hash
    finally:
        dht.shutdown()


def test_trainers_that_wait_for_each_other_start_together() -> None:
    """`--wait-for-trainers`: each trainer holds its first inner step until the other's averager is
    up. The averaging service lists trainers by their round declarations, which a waiting trainer
    had not made yet: two trainers waiting for each other waited for ever."""
    config = tiny_config(1)
    with harness() as h:
        handles = [h.prepare(config, name, wait_for_peers=1) for name in ("w0", "w1")]
        for handle in handles:
            handle.start()
        for handle in handles:
            assert wait_until(finished(handle, 1), timeout_s=120), "a trainer never started"
        assert [t.error for t in handles] == [None, None]
        assert [r.num_peers for t in handles for r in t.reports] == [2, 2]
