"""Two trainers whose states diverged reconverge; a trainer with two or more partners still needs two.

A round in which a member dies can leave the survivors holding different states (a commit that
missed one member's deadline: `node.collective.book`). The next round's majority check calls one
of them out of sync, and it resyncs from the run. When the run is down to that one partner, no
second source can ever confirm the partner's state, so before, the two kept their own states for
ever (the flaky `test_killed_trainer_does_not_stop_the_others`). A trainer whose only live partner
is one it has averaged in sync with now takes that partner's state on its word; with two or more
such partners, one of them alone still moves nothing.
"""

from __future__ import annotations

import torch

from node.collective.averager import GatherAverager
from node.collective.outer_state import OuterState
from node.swarm import wait_until
from tests.helpers.gather import SHAPES, gather_swarm, run_round


def _state(value: float, step: int) -> OuterState:
    return OuterState([torch.full(s, value) for s in SHAPES], [torch.zeros(s) for s in SHAPES], step)


def _grads(n: int) -> list[list[torch.Tensor]]:
    return [[torch.randn(s) * 0.01 for s in SHAPES] for _ in range(n)]


def _serve(averager: GatherAverager, state: OuterState) -> None:
    averager.set_state_provider(state.clone)
    averager.prepare_round(state.step, 0.0, state.hash())
    averager.publish_step(state.step)


def test_two_diverged_trainers_reconverge_on_the_round_winners_state() -> None:
    with gather_swarm(2) as pair:
        start = _state(0.5, 1)
        outcomes = run_round(pair, 1, _grads(2), [start.hash()] * 2)
        assert all(o.in_sync and o.num_peers == 2 for o in outcomes), outcomes

        states = [_state(1.0, 2), _state(2.0, 2)]  # what a round with different final sets leaves
        outcomes = run_round(pair, 2, _grads(2), [s.hash() for s in states])
        assert sorted(o.in_sync for o in outcomes) == [False, True], outcomes
        winner, loser = (0, 1) if outcomes[0].in_sync else (1, 0)

        ahead = _state(float(winner + 1) + 0.25, 3)
        _serve(pair[winner], ahead)
        fetched = pair[loser].fetch_state(newer_than=2, wait_s=30.0)
        assert fetched is not None, "the out-of-sync trainer kept its own state"
        assert fetched.step == 3 and fetched.hash() == ahead.hash()


def test_one_of_two_partners_cannot_move_a_trainer_alone() -> None:
    with gather_swarm(3) as (a0, a1, a2):
        start = _state(0.5, 1)
        outcomes = run_round([a0, a1, a2], 1, _grads(3), [start.hash()] * 3)
        assert all(o.in_sync and o.num_peers == 3 for o in outcomes), outcomes
        assert wait_until(lambda: {1} == set(a0.peer_steps().values()), timeout_s=30)

        _serve(a1, _state(7.0, 3))
        _serve(a2, _state(8.0, 3))
        assert wait_until(lambda: set(a0.peer_steps().values()) == {3}, timeout_s=30)
        assert a0.fetch_state(newer_than=2, wait_s=2.0) is None
