"""#30 item 1 on the averaging service: identities without history cannot move a running trainer's state.

Three fresh identities declare a far later outer step and serve the same poisoned state (its hash
consistent, so it verifies). Before, every running trainer took their steps for the run's, gave
its round up as left behind, and downloaded the state two of them agreed on. Now a trainer that
has averaged in sync with others counts only those others' steps and only their word on a state;
a joiner, which has no such history, refuses the state by its loss on its own held-out text.
"""

from __future__ import annotations

import torch

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from node.collective.outer_state import OuterState
from node.collective.round_types import RoundOutcome
from node.dht_node import start_loopback_dht
from node.swarm import wait_until
from protocol.dht_keys import averaging_prefix
from tests.helpers.gather import SHAPES, gather_swarm, run_round
from tests.helpers.poisoning import sybil_state_round
from tests.helpers.trainers import finished, harness, tiny_config

HONEST_HASH = "00" * 8


def _round(averagers: list[GatherAverager], step: int) -> list[RoundOutcome]:
    grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in averagers]
    return run_round(averagers, step, grads, [HONEST_HASH] * len(averagers))


def test_sybils_agreeing_on_a_later_state_move_no_running_trainer() -> None:
    result = sybil_state_round()
    assert all(o.in_sync and o.num_peers == 2 for o in result.outcomes), result.outcomes
    assert result.offered == [None, None]


def test_a_joiner_refuses_the_poisoned_state_sybils_agree_on() -> None:
    """A joiner has no standing: three fresh identities agreeing on a state are two agreeing sources
    to it. What it checks itself is the state's loss on its own held-out text: a poisoned state
    (large random weights) is far worse than even its untrained model, and it starts from its own."""
    config = tiny_config(1, join_wait_s=1.0)
    with harness() as h:
        joiner = h.prepare(config, "joiner")
        shapes = [p.shape for p in joiner.runtime.model.parameters()]
        gen = torch.Generator().manual_seed(3)
        params = [torch.randn(s, generator=gen) * 50.0 for s in shapes]
        poisoned = OuterState(params, [torch.zeros(s) for s in shapes], 50)
        sybils: list[GatherAverager] = []
        try:
            for i in range(3):
                sybil = GatherAverager(
                    shapes,
                    start_loopback_dht(h.peers),
                    prefix=averaging_prefix(config.run_id),
                    codec=codec_for("int8", shapes),
                    config=AveragingConfig(),
                    name=f"sybil{i}",
                )
                sybils.append(sybil)
                sybil.set_state_provider(poisoned.clone)
                sybil.prepare_round(50, 0.0, poisoned.hash())
                sybil.publish_step(50)
            averager = joiner.runtime.averager
            assert wait_until(lambda: sum(v == 50 for v in averager.peer_steps().values()) == 3, timeout_s=60)
            joiner.start()
            assert wait_until(finished(joiner, 1), timeout_s=180)
            assert joiner.error is None
            assert [r.outer_step for r in joiner.reports] == [1], "the joiner took the sybils' state"
        finally:
            for sybil in sybils:
                sybil.shutdown()
                dht = sybil.rounds.dht
                if dht is not None:
                    dht.shutdown()


def test_a_trainer_whose_partners_all_left_takes_the_state_the_live_trainers_agree_on() -> None:
    """Seen in the churn soak: a trainer's only partner with standing was killed, and its standing
    still named only that partner, so it counted nobody else's word on a state or a step and could
    never resync to the trainers carrying the run on. Standing counts while its peers live: once the
    partner's declaration lapses, the trainer is a newcomer again (two agreeing sources)."""
    with gather_swarm(4) as (a0, a1, b0, b1):
        assert all(o.num_peers == 2 and o.in_sync for o in _round([a0, a1], 0))
        run_state = OuterState([torch.full(s, 0.5) for s in SHAPES], [torch.zeros(s) for s in SHAPES], 6)
        for b in (b0, b1):
            b.set_state_provider(run_state.clone)
            b.prepare_round(6, 0.0, run_state.hash())
            b.publish_step(6)
        assert wait_until(lambda: sum(v == 6 for v in a0.peer_steps().values()) == 2, timeout_s=60)
        assert a0.fetch_state(newer_than=1, wait_s=0.0) is None  # its partner lives: only its word counts
        a1.shutdown()
        a1_dht = a1.rounds.dht
        assert a1_dht is not None
        a1_dht.shutdown()
        assert wait_until(lambda: len(a0.peer_steps()) == 2, timeout_s=60), "a1's declaration did not lapse"
        taken = a0.fetch_state(newer_than=1, wait_s=0.0)
        assert taken is not None and taken.hash() == run_state.hash()
