"""A joiner never takes one peer's word for the run's state (`GatherAverager.fetch_state`, `StateService.fetch`).

On 127.0.0.1, with the scenario of `tests.helpers.poisoning` (which `bench/robustness.py` runs
too): two honest trainers serve the same state at outer step 5; an attacker serves parameters of
1e4 and, with two fake trainers that declare step 100 and serve nothing, is tried first. It serves
either its poisoned state under that state's own hash (one source, nobody confirms it) or the
poisoned tensors under the honest step and hash (they do not hash to it). The joiner must take the
honest state. With a single other trainer no state is confirmed: the joiner downloads it, refuses
it after its bounded wait and logs why, unless that trainer is one of the run's authorised
publishers (`trusted_state_sources`): then its state is taken on its own, still only if its tensors
hash to what it advertises. A resync waits for a source that is still finishing its round.

A newcomer has no standing (`AveragingService.standing`), so every peer's word counts as a witness
here; what standing changes for a running trainer is `test_gather_sybil_state.py`'s.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator

import pytest
import torch

from node.collective import state_wire as wire
from node.collective.averager import _PEER_POLL_S, GatherAverager
from node.collective.outer_state import OuterState
from node.swarm import wait_until
from tests.helpers.gather import gather_swarm
from tests.helpers.poisoning import (
    HONEST,
    HONEST_STEP,
    POISONING_VARIANTS,
    SHAPES,
    LyingStateServer,
    PoisonedRun,
    fetch_as_joiner,
    outer_state,
    poison_accepted,
    poisoned_swarm,
)

AVERAGER_LOG = "node.collective.averager"


def _serve_honest_state(averager: GatherAverager) -> None:
    """`averager` declares the honest step and serves the honest state."""
    averager.set_state_provider(HONEST.clone)
    averager.prepare_round(HONEST_STEP, 0.0, HONEST.hash())
    averager.publish_step(HONEST_STEP)


@pytest.fixture(params=POISONING_VARIANTS)
def run(request: pytest.FixtureRequest) -> Iterator[PoisonedRun]:
    with poisoned_swarm(request.param) as poisoned:
        yield poisoned


def test_the_joiner_refuses_a_poisoned_state(run: PoisonedRun) -> None:
    fetched = fetch_as_joiner(run.joiner)
    assert fetched is not None, "the joiner took no state although two honest sources agree"
    assert fetched.step == HONEST_STEP
    assert fetched.hash() == HONEST.hash()
    assert max(float(p.abs().max()) for p in fetched.params) < 1.0
    assert not poison_accepted(fetched)
    # The attack was tried, not skipped: the joiner downloaded the attacker's state first.
    assert run.attacker_served_its_state()
    if run.variant == "copied-hash":  # tensors that do not hash to the advertised hash prove a lie
        assert run.joiner.bans.is_banned(run.attacker_id)


def test_with_a_single_other_trainer_no_state_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    """The joiner downloads the one source's state whole and refuses it for want of a second source;
    its warning names the refused state (source, step and hash), so that an operator can tell
    "nobody serves a state" from "one peer's state was refused"."""
    torch.set_num_threads(1)
    with gather_swarm(2, shapes=SHAPES) as (other, joiner):
        _serve_honest_state(other)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        with caplog.at_level(logging.WARNING, logger=AVERAGER_LOG):
            assert joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0) is None
        assert joiner.states.bytes_received >= wire.payload_bytes(SHAPES)
        assert not joiner.bans.is_banned(other.p2p.peer_id)
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "keeping our own" in warnings
    assert f"step {HONEST_STEP}" in warnings and HONEST.hash() in warnings, warnings


def test_a_single_authorised_publisher_is_taken_on_its_own() -> None:
    """A joiner of a run of two takes the state of the trainer it names as a publisher on its own
    (a trainer with no standing takes no other single source: the test above)."""
    torch.set_num_threads(1)
    with gather_swarm(2, shapes=SHAPES, trust_each_other=True) as (other, joiner):
        _serve_honest_state(other)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        fetched = joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0)
    assert fetched is not None, "the joiner refused the state of the run's authorised publisher"
    assert (fetched.step, fetched.hash()) == (HONEST_STEP, HONEST.hash())


def test_an_authorised_publisher_is_still_checked() -> None:
    """Same run as above, but the publisher serves poisoned tensors under the honest step and hash."""
    torch.set_num_threads(1)
    with gather_swarm(2, shapes=SHAPES, trust_each_other=True) as (other, joiner):
        lying = LyingStateServer()
        lying.take_over(other)
        other.prepare_round(HONEST_STEP, 0.0, HONEST.hash())
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        assert joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0) is None
        assert lying.payloads_sent >= 1, "the joiner never downloaded the publisher's state"
        assert joiner.bans.is_banned(other.p2p.peer_id)


def test_a_resync_waits_for_a_source_that_is_still_finishing_the_round() -> None:
    """The only source has declared its next round (step 5) but still serves step 0: a straggler of the
    round on a loaded machine. The resync keeps asking it past its per-request timeout (up to the
    averaging timeout: a fixed 10 s wait once gave up first and left two of three trainers diverged in
    a CI run) and takes its state once it has finished the round."""
    torch.set_num_threads(1)
    request_timeout_s = 2.0
    # The resync pauses _PEER_POLL_S between two requests to a source: this many refusals take longer
    # than one request may.
    refusals_past_timeout = math.floor(request_timeout_s / _PEER_POLL_S) + 2
    with gather_swarm(2, shapes=SHAPES, trust_each_other=True, averaging_timeout_s=45.0) as (other, joiner):
        served = [outer_state(0.5, 0)]
        other.set_state_provider(lambda: served[0].clone())
        other.publish_step(0)
        other.prepare_round(HONEST_STEP, 0.0, HONEST.hash())
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)

        fetched: list[OuterState | None] = []
        resync = threading.Thread(
            target=lambda: fetched.append(joiner.fetch_state(newer_than=0, timeout_s=request_timeout_s))
        )
        resync.start()
        try:
            assert wait_until(
                lambda: other.states.refusals["stale"] >= refusals_past_timeout or not resync.is_alive(),
                timeout_s=60,
            )
            assert resync.is_alive(), f"the resync gave up before the straggler reached the step: {fetched}"
            served[0] = HONEST
            other.publish_step(HONEST_STEP)  # the straggler finishes the round
        finally:
            resync.join(60)
        assert not resync.is_alive()
    assert fetched and fetched[0] is not None, "the resync gave up before the straggler reached the step"
    assert (fetched[0].step, fetched[0].hash()) == (HONEST_STEP, HONEST.hash())


def test_an_unconfirmed_state_is_downloaded_once_while_the_joiner_waits_for_confirmation() -> None:
    """Each poll for a second source used to download the whole state again from the one source (a
    real model's state every half second). Now later polls ask it only for its offer, and once a
    second source appears, its offer confirms the state already held."""
    torch.set_num_threads(1)
    with gather_swarm(3, shapes=SHAPES) as (first, second, joiner):
        _serve_honest_state(first)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        fetched: list[OuterState | None] = []
        waiting = threading.Thread(
            target=lambda: fetched.append(joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=120.0))
        )
        waiting.start()
        try:
            assert wait_until(lambda: first.states.answered.total() >= 3, timeout_s=60), (
                "the joiner stopped polling"
            )
            _serve_honest_state(second)
        finally:
            waiting.join(timeout=150)
        assert fetched and fetched[0] is not None and fetched[0].hash() == HONEST.hash()
        assert first.states.answered["download"] == 1, dict(first.states.answered)
        assert second.states.answered["download"] == 0, dict(second.states.answered)
