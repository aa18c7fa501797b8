"""DiLoCo trainers on the averaging service (`averager = "gather"`): the run's guarantees hold with
either codec: bit-identical trainers after every outer step, a late joiner that takes the run's
state, and survivors that go on without a trainer killed mid-run."""

from __future__ import annotations

from typing import Any

import pytest

from node.swarm import wait_until
from tests.helpers.trainers import (
    assert_a_late_joiner_catches_up,
    finished,
    harness,
    hashes_by_step,
    tiny_config,
)
from training.diloco import OuterStepReport
from training.simulation import simulate_diloco
from training.trainer import TrainerConfig


def _gather(steps: int, codec: str = "sparse", **overrides: Any) -> TrainerConfig:
    return tiny_config(
        steps,
        averager="gather",
        compression=codec,
        sparse_density=0.05,
        sparse_chunk_values=256,
        **overrides,
    )


@pytest.mark.parametrize("codec", ["int8", "sparse"])
def test_three_gather_trainers_agree_bit_for_bit_after_every_outer_step(codec: str) -> None:
    config = _gather(4, codec, sender_timeout_s=15.0, averaging_timeout_s=60.0)
    reports = simulate_diloco(3, config)
    by_step: dict[int, list[OuterStepReport]] = {}
    for r in reports:
        by_step.setdefault(r.outer_step, []).append(r)
    assert sorted(by_step) == [1, 2, 3, 4]
    for step, group in by_step.items():
        assert len(group) == 3
        assert len({r.outer_hash for r in group}) == 1, f"peers disagree after outer step {step}"
        assert all(r.num_peers == 3 for r in group), group
    assert all(r.bytes_sent > 0 for r in reports)
    first = sum(r.train_loss for r in by_step[1]) / 3
    last = sum(r.train_loss for r in by_step[4]) / 3
    assert last < first


def test_a_late_gather_joiner_takes_the_runs_state() -> None:
    assert_a_late_joiner_catches_up(_gather(9), join_after=3)


@pytest.mark.slow
def test_a_killed_gather_trainer_does_not_stop_the_others() -> None:
    config = _gather(8, sender_timeout_s=3.0)
    with harness() as h:
        trainers = h.start_many(config, ["t0", "t1", "t2"])
        assert wait_until(lambda: all(t.steps() >= 2 for t in trainers), timeout_s=180)
        victim, survivors = trainers[2], trainers[:2]
        killed_at = victim.steps()
        victim.kill()
        for t in survivors:
            assert wait_until(finished(t, 8), timeout_s=300)
            assert t.error is None and t.steps() == 8
        x, y = (hashes_by_step(t.reports) for t in survivors)
        assert x[8] == y[8]
        later = [r for t in survivors for r in t.reports if r.outer_step > killed_at + 2]
        assert later and all(r.num_peers == 2 for r in later)
