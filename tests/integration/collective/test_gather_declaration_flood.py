"""A flood of valid round declarations from identities with no host behind them hides no trainer
from another (#30 item 7, the matchmaking key).

A declaration is a signed record anyone can make with a fresh key. 600 of them for the round's
step (19 times the group size; `bench/robustness.py` floods the key to its cap of 1,024), stored
at both honest trainers' DHT nodes: every member
picks the same candidates from the declarations, at most `max_group_size`, so the two honest
trainers each drew 31 sybils and averaged alone, round after round. A round now walks past the
candidates it cannot reach to the next declared ones, and the next rounds pass over those
identities while they keep declaring: the two average with each other in every round, the second
round sends to nobody else, and each round says what it could not reach in one log line.
"""

from __future__ import annotations

import hivemind
import pytest
import torch

from node.collective.averager import GatherAverager
from node.collective.round_types import RoundOutcome
from tests.helpers.gather import SHAPES, averaged_together, dht_of, flood_declarations, gather_swarm

SYBILS = 600
SEED = b"declaration-flood"
OUTER_HASH = "0123456789abcdef"


def _round(pair: list[GatherAverager], step: int) -> list[RoundOutcome]:
    grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in pair]
    pending = [a.start_average(g, step=step, outer_hash=OUTER_HASH) for a, g in zip(pair, grads, strict=True)]
    return [p.result() for p in pending]


def test_a_flood_of_declarations_with_no_host_behind_them_hides_no_trainer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="node.collective.service")
    # a trainer's default timeouts: the walk past the sybils (three failed sends each) fits in them
    with gather_swarm(2, gather_timeout_s=30.0, averaging_timeout_s=120.0) as pair:
        first = dht_of(pair[0])
        attacker = hivemind.DHT(
            start=True,
            initial_peers=[str(a) for a in first.get_visible_maddrs()],
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        )
        try:
            for step in (1, 2):
                for averager in pair:
                    averager.prepare_round(step, 0.0, OUTER_HASH)
                flood_declarations(attacker, pair, step, OUTER_HASH, count=SYBILS, seed=SEED)
                sent_before = [a.rounds.requests_sent for a in pair]
                outcomes = _round(pair, step)
                assert averaged_together(outcomes), f"outer step {step}: {outcomes}"
                if step == 2:  # the same sybils again: passed over, not tried
                    sent = [a.rounds.requests_sent - b for a, b in zip(pair, sent_before, strict=True)]
                    assert max(sent) <= 4, f"the second round still tried the sybils: {sent} requests"
        finally:
            attacker.shutdown()
    unreachable = [r for r in caplog.records if "could not be reached" in r.getMessage()]
    assert len(unreachable) == 2, [r.getMessage() for r in unreachable]  # one line per trainer and flood
    assert not any("averaging exchange with" in r.getMessage() for r in caplog.records)
