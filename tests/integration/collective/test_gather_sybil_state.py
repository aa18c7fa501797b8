"""#30 item 1 on the averaging service: identities without history cannot move a running trainer's state.

Three fresh identities declare a far later outer step and serve the same poisoned state (its hash
consistent, so it verifies). Before, every running trainer took their steps for the run's, gave
its round up as left behind, and downloaded the state two of them agreed on. Now a trainer that
has averaged in sync with others counts only those others' steps and only their word on a state.
"""

from __future__ import annotations

import torch

from node.collective.averager import GatherAverager
from node.collective.outer_state import OuterState
from node.collective.round_types import RoundOutcome
from node.swarm import wait_until
from tests.helpers.gather import SHAPES, gather_swarm, run_round

HONEST_HASH = "00" * 8


def _round(averagers: list[GatherAverager], step: int) -> list[RoundOutcome]:
    grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in averagers]
    return run_round(averagers, step, grads, [HONEST_HASH] * len(averagers))


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
