"""#30 item 4: a flood of outer-state downloads from free identities is held to the state service's budgets.

Four fresh identities with four concurrent download streams each ask a trainer's `StateService`
for its full state in a loop, ignoring every "try again". The trainer refuses them on its
per-peer budgets and stream caps, serves each identity at most `downloads_per_peer_per_window`
states, so uploads at most that many states per identity in all, and still serves an honest
joiner that names it as a trusted source while the flood runs. The victim's window is made an hour
long so that no token refills during the test: the bound on each identity is then exact.

The work is bounded too: an identity told once that its request budget is spent has its further
streams closed unread until its budget refills. What remains is the cost of each stream's opening
(p2pd and its socket to this process); `bench/robustness.py` part 5 measures what that does to the
trainer's inner steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from node.collective import state_wire as wire
from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from node.collective.outer_state import OuterState
from node.collective.state_service import StateServiceConfig
from node.dht_node import start_loopback_dht
from node.swarm import wait_until
from tests.helpers.gather import PREFIX, SHAPES
from tests.helpers.state_flood import state_flood

IDENTITIES, STREAMS = 4, 4
STEP = 5
BUDGET = StateServiceConfig(window_s=3600.0)  # the production budgets, none refilled during the test


@contextlib.contextmanager
def _victim_and_joiner() -> Iterator[tuple[GatherAverager, GatherAverager, list[str]]]:
    """A victim serving its state and a joiner that names it as a trusted source; the victim's addresses."""
    victim_dht = start_loopback_dht()
    peers = [str(a) for a in victim_dht.get_visible_maddrs()]
    joiner_dht = start_loopback_dht(peers)
    settings = AveragingConfig(
        gather_timeout_s=20.0, commit_timeout_s=5.0, averaging_timeout_s=40.0, request_timeout_s=5.0
    )
    averagers: list[GatherAverager] = []
    try:
        for name, dht, trusted in (("victim", victim_dht, ()), ("joiner", joiner_dht, (victim_dht.peer_id,))):
            averagers.append(
                GatherAverager(
                    SHAPES,
                    dht,
                    prefix=PREFIX,
                    codec=codec_for("int8", SHAPES, density=0.1, chunk_values=64),
                    config=settings,
                    state_config=BUDGET,
                    trusted_state_sources=trusted,
                    name=name,
                )
            )
        yield averagers[0], averagers[1], peers
    finally:
        for averager in averagers:
            averager.shutdown()
        joiner_dht.shutdown()
        victim_dht.shutdown()


def test_a_state_download_flood_is_held_to_the_budgets_and_an_honest_joiner_still_gets_the_state() -> None:
    gen = torch.Generator().manual_seed(0)
    state = OuterState(
        [torch.randn(s, generator=gen) for s in SHAPES], [torch.randn(s, generator=gen) for s in SHAPES], STEP
    )
    with _victim_and_joiner() as (victim, joiner, peers):
        victim.set_state_provider(state.clone)
        victim.prepare_round(STEP, 0.0, state.hash())
        victim.publish_step(STEP)
        assert wait_until(lambda: joiner.peer_steps() == {victim.p2p.peer_id.to_bytes(): float(STEP)}, 60)

        with state_flood(
            victim.p2p.peer_id, victim.states.proto, SHAPES, peers, identities=IDENTITIES, streams=STREAMS
        ) as flood:
            # every identity has spent its downloads and is being refused: the flood is at full strength
            assert wait_until(
                lambda: all(r["download_budget"] + r["request_budget"] > 0 for r in flood.stats().refusals),
                timeout_s=60,
            ), flood.stats()
            fetched = joiner.fetch_state(newer_than=0, timeout_s=30.0, wait_s=60.0)
            # and goes on until every identity has spent its requests too
            assert wait_until(lambda: all(r["request_budget"] > 0 for r in flood.stats().refusals), 60)
            stats = flood.stop()

        # (d) the honest joiner got the victim's state while the flood ran
        assert fetched is not None
        assert (fetched.step, fetched.hash()) == (STEP, state.hash())

        # (a) the victim refused the flood on its budgets and on its stream caps, and banned nobody
        refused = victim.states.refusals
        assert refused["download_budget"] > 0 and refused["request_budget"] > 0, refused
        assert refused["streams"] + refused["request_streams"] + refused["preempted"] > 0, refused
        assert refused["malformed"] == refused["banned"] == 0, refused
        assert stats.total_failures["invalid"] == 0, stats

        # (b) no identity got more full states than its budget
        cap = BUDGET.downloads_per_peer_per_window
        assert stats.total_downloads >= 1, stats
        assert all(n <= cap for n in stats.downloads), stats.downloads

        # (c) what the victim uploaded is bounded by the budgets: `cap` states per identity, one for the joiner
        header = len(wire.encode_header(STEP, state.hash(), victim.states.expected_bytes)) + 4
        one_state = victim.states.expected_bytes + header
        assert victim.states.bytes_sent <= (IDENTITIES * cap + 1) * one_state, victim.states.bytes_sent
        assert (
            stats.total_bytes <= IDENTITIES * cap * one_state + stats.total_requests * wire.MAX_HEADER_BYTES
        )
        assert stats.total_bytes >= stats.total_downloads * victim.states.expected_bytes


def test_an_identity_over_its_budget_costs_the_victim_bounded_work_per_window() -> None:
    """Per window, the requests a victim reads and answers for one identity are bounded (here: twice
    its request budget), however many streams the identity opens: once told its budget is spent, its
    streams are closed unread (before, each was read, checked, answered and lingered on)."""
    state = OuterState([torch.ones(s) for s in SHAPES], [torch.zeros(s) for s in SHAPES], STEP)
    requests_per_identity = 20 * BUDGET.offers_per_peer_per_window
    with _victim_and_joiner() as (victim, _, peers):
        victim.states.set_state(state)
        with state_flood(
            victim.p2p.peer_id, victim.states.proto, SHAPES, peers, identities=IDENTITIES, streams=STREAMS
        ) as flood:
            assert wait_until(lambda: min(flood.stats().requests) >= requests_per_identity, timeout_s=120)
            stats = flood.stop()
    refusals = dict(victim.states.refusals)
    answered = sum(n for reason, n in refusals.items() if reason != "shunned") + sum(stats.downloads)
    bound = IDENTITIES * 2 * BUDGET.offers_per_peer_per_window
    assert answered <= bound, (answered, bound, stats.total_requests, refusals)
