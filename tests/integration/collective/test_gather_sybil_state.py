"""#30 item 1 on the averaging service: identities without history cannot move a running trainer's state.

Three fresh identities declare a far later outer step and serve the same poisoned state (its hash
consistent, so it verifies). Before, every running trainer took their steps for the run's, gave
its round up as left behind, and downloaded the state two of them agreed on. Now a trainer that
has averaged in sync with others counts only those others' steps and only their word on a state.
"""

from __future__ import annotations

import threading

import torch

from node.averaging.outer_state import OuterState
from node.averaging.rounds import RoundOutcome
from node.swarm import wait_until
from tests.helpers.gather import SHAPES, gather_swarm

HONEST_HASH = "00" * 8


def _round(averagers: list, step: int) -> list[RoundOutcome]:
    for a in averagers:
        a.prepare_round(step, 0.5, HONEST_HASH)
    assert wait_until(
        lambda: all(
            sum(1 for s in a.peer_steps().values() if s == step) == len(averagers) - 1 for a in averagers
        ),
        timeout_s=60,
    )
    outcomes: list[RoundOutcome | None] = [None] * len(averagers)

    def one(i: int) -> None:
        grads = [torch.randn(s) * 0.01 for s in SHAPES]
        outcomes[i] = averagers[i].start_average(grads, step=step, outer_hash=HONEST_HASH).result()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(averagers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def test_sybils_agreeing_on_a_later_state_move_no_running_trainer() -> None:
    with gather_swarm(5) as (a0, a1, *sybils):
        honest = [a0, a1]
        assert all(o.num_peers == 2 and o.in_sync for o in _round(honest, 0))
        poisoned = OuterState([torch.full(s, 7.0) for s in SHAPES], [torch.zeros(s) for s in SHAPES], 50)
        for s in sybils:
            s.set_state_provider(poisoned.clone)
            s.prepare_round(50, 0.0, poisoned.hash())
            s.publish_step(50)
        assert wait_until(lambda: sum(v == 50 for v in a0.peer_steps().values()) == 3, timeout_s=60)

        outcomes = _round(honest, 1)
        assert all(o.in_sync and o.num_peers == 2 for o in outcomes), outcomes
        assert a0.fetch_state(newer_than=1, wait_s=0.0) is None
        assert a1.fetch_state(newer_than=1, wait_s=0.0) is None
