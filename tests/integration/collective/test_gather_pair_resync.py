"""Two trainers whose states diverged reconverge; a trainer with two or more partners still needs two.

A round in which a member dies can leave the survivors holding different states (a commit that
missed one member's deadline: `node.collective.book`). The next round's majority check calls one
of them out of sync, and it resyncs from the run. When the run is down to that one partner, no
second source can ever confirm the partner's state, so before, the two kept their own states for
ever (the flaky `test_killed_trainer_does_not_stop_the_others`). A trainer whose only live partner
is one it has averaged in sync with now takes that partner's state on its word; with two or more
such partners, one of them alone still moves nothing.

A round that leaves one of two trainers out of sync can also be the run's last: the winner used to
stop serving as soon as it had applied its last outer step, so the loser kept its own state. A
trainer whose run ends now declares it and serves its final state until the others reach it.
"""

from __future__ import annotations

import threading

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


def test_at_the_end_of_a_run_the_winner_serves_its_last_state_until_the_loser_has_it() -> None:
    with gather_swarm(2) as pair:
        start = _state(0.5, 7)
        outcomes = run_round(pair, 7, _grads(2), [start.hash()] * 2)
        assert all(o.in_sync and o.num_peers == 2 for o in outcomes), outcomes
        winner, loser = pair
        last = _state(3.0, 8)  # the run's last outer step, as the winner applied it
        winner.set_state_provider(last.clone)
        stop, held = threading.Event(), []
        holding = threading.Thread(
            target=lambda: held.append(winner.hold_final_state(8, last.hash(), stop_event=stop))
        )
        holding.start()
        try:
            # the loser, told by the last round that it is out of sync, looks for the run's state
            fetched = loser.fetch_state(newer_than=7, wait_s=30.0)
            assert fetched is not None, "the run's last state was not served"
            assert fetched.step == 8 and fetched.hash() == last.hash()
            assert holding.is_alive()  # still serving: the loser has not declared outer step 8 yet
            loser.set_state_provider(fetched.clone)
            assert loser.hold_final_state(
                8, fetched.hash(), stop_event=threading.Event()
            )  # the winner is there
            holding.join(60)
            assert held == [True]  # it stopped once the loser had reached outer step 8
        finally:
            stop.set()
            holding.join(60)


def test_a_stop_ends_a_search_for_the_runs_state_at_once() -> None:
    """Ctrl-C during a resync: the search that no source can satisfy ends with the stop, not after
    the averaging timeout (the node's shutdown waits for the training thread)."""
    with gather_swarm(3) as (a0, a1, a2):
        start = _state(0.5, 1)
        outcomes = run_round([a0, a1, a2], 1, _grads(3), [start.hash()] * 3)
        assert all(o.in_sync and o.num_peers == 3 for o in outcomes), outcomes
        _serve(a1, _state(7.0, 3))  # two partners that disagree: nothing can be taken
        _serve(a2, _state(8.0, 3))
        assert wait_until(lambda: set(a0.peer_steps().values()) == {3}, timeout_s=30)

        stop, fetched = threading.Event(), []
        searching = threading.Thread(
            target=lambda: fetched.append(a0.fetch_state(newer_than=2, wait_s=3600.0, stop_event=stop))
        )
        searching.start()
        try:
            assert wait_until(lambda: a1.states.bytes_sent > 0 and a2.states.bytes_sent > 0, timeout_s=60)
            stop.set()
            searching.join(30)
            assert not searching.is_alive(), "the search went on after the stop"
            assert fetched == [None]
        finally:
            stop.set()
            searching.join(60)
