"""Elastic DiLoCo: a late joiner downloads parameters, momentum and step; a killed trainer does not stop the others."""

from __future__ import annotations

import pytest

from node.swarm import wait_until
from tests.helpers.trainers import (
    assert_a_late_joiner_catches_up,
    averaging_mode,
    finished,
    harness,
    hashes_by_step,
    tiny_config,
)


@pytest.mark.parametrize("mode", ["int8", "sparse"])
def test_late_joiner_receives_parameters_momentum_and_step(mode: str) -> None:
    assert_a_late_joiner_catches_up(tiny_config(9, **averaging_mode(mode)), join_after=3)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "sparse"])
def test_killed_trainer_does_not_stop_the_others(mode: str) -> None:
    config = tiny_config(8, sender_timeout_s=3.0, **averaging_mode(mode))
    with harness() as h:
        trainers = h.start_many(config, ["t0", "t1", "t2"])
        assert wait_until(lambda: all(t.steps() >= 2 for t in trainers), timeout_s=180)
        assert all(r.num_peers == 3 for t in trainers for r in t.reports[:2])
        victim, survivors = trainers[2], trainers[:2]
        killed_at = victim.steps()
        victim.kill()
        for t in survivors:
            assert wait_until(finished(t, 8), timeout_s=300)
            assert t.error is None and t.steps() == 8
        x, y = (hashes_by_step(t.reports) for t in survivors)
        assert x[8] == y[8]
        later = [r for t in survivors for r in t.reports if r.outer_step > killed_at + 2]
        assert later and all(r.num_peers <= 2 for r in later)
        assert any(r.num_peers == 2 for r in later)
