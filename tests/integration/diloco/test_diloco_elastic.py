"""Elastic DiLoCo: a late joiner downloads parameters, momentum and step; a killed trainer does not stop the others."""

from __future__ import annotations

import pytest

from node.swarm import wait_until
from tests.helpers.trainers import finished, harness, hashes_by_step, tiny_config


def test_late_joiner_receives_parameters_momentum_and_step() -> None:
    config = tiny_config(9)
    with harness() as h:
        a, b = h.start_many(config, ["early0", "early1"])
        assert wait_until(lambda: a.steps() >= 3 and b.steps() >= 3, timeout_s=180)
        joined_at = max(a.steps(), b.steps())
        c = h.start(config, "late")
        for t in (a, b, c):
            assert wait_until(finished(t, 9), timeout_s=240)
        assert a.error is None and b.error is None and c.error is None
        assert [t.steps() for t in (a, b, c)] == [9, 9, 9]
        # The joiner started from the run's step (not from 0) ...
        first = c.reports[0]
        assert first.outer_step > joined_at
        # ... with the run's parameters and momentum: after every round it shares with the others,
        # its state hash (which covers parameters and momentum) equals theirs.
        early = hashes_by_step(a.reports)
        assert hashes_by_step(b.reports) == early
        shared = [r for r in c.reports if r.num_peers == 3]
        assert shared, "the joiner never averaged with the others"
        for r in shared:
            assert r.outer_hash == early[r.outer_step], f"joiner differs after outer step {r.outer_step}"
        assert c.reports[-1].outer_hash == early[9]


@pytest.mark.slow
def test_killed_trainer_does_not_stop_the_others() -> None:
    config = tiny_config(8, sender_timeout_s=3.0)
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
