"""A joiner never takes one peer's word for the run's state (`node.averaging.state_sync`).

On 127.0.0.1: two honest trainers hold the same state at outer step 5; an attacker serves
parameters of 1e4 and, with fake state-sharing entries in the DHT (peers that serve nothing)
advertising step 100, makes the joiner try it first. The attacker either advertises the hash of
its poisoned state, at step 100 (one source, nobody confirms it), or copies the honest step and
hash (its tensors do not hash to it). The joiner must take the honest state. With a single other
trainer, no state is confirmed: the joiner refuses it after its bounded wait and logs why,
unless that trainer is one of the run's authorised publishers: then its state is taken on its own,
still only if its tensors hash to what it advertises. (The scenario with the attacker is
`tests.helpers.poisoning`, which `bench/robustness.py` runs too.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import torch

from node.averaging.averager import DiLoCoAverager
from node.swarm import wait_until
from tests.helpers.poisoning import (
    HONEST,
    HONEST_STEP,
    POISON,
    POISONING_VARIANTS,
    SHAPES,
    HashCopyingAverager,
    fetch_as_joiner,
    outer_state,
    poison_accepted,
    poisoned_run,
)
from tests.helpers.trainers import averager_swarm


@pytest.fixture(params=POISONING_VARIANTS)
def run(request: pytest.FixtureRequest) -> Iterator[tuple[DiLoCoAverager, str]]:
    with poisoned_run(request.param) as joiner:
        yield joiner, request.param


def test_the_joiner_refuses_a_poisoned_state(run: tuple[DiLoCoAverager, str]) -> None:
    joiner, _ = run
    fetched = fetch_as_joiner(joiner)
    assert fetched is not None, "the joiner took no state although two honest sources agree"
    assert fetched.step == HONEST_STEP
    assert fetched.hash() == HONEST.hash()
    assert max(float(p.abs().max()) for p in fetched.params) < 1.0
    assert not poison_accepted(fetched)


def test_with_a_single_other_trainer_no_state_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    torch.set_num_threads(1)
    with averager_swarm(SHAPES, [DiLoCoAverager, DiLoCoAverager], prefix="alonetest") as (other, joiner):
        other.set_state_provider(HONEST.clone)
        other.publish_step(HONEST_STEP)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        with caplog.at_level(logging.WARNING, logger="node.averaging.state_sync"):
            assert joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0) is None
        assert "refusing unconfirmed outer state" in caplog.text
        assert f"step {HONEST_STEP} hash {HONEST.hash()}" in caplog.text


def test_a_single_authorised_publisher_is_taken_on_its_own() -> None:
    """A run of two trainers that name each other recovers from a diverged round (the only way it can)."""
    torch.set_num_threads(1)
    classes = [DiLoCoAverager, DiLoCoAverager]
    with averager_swarm(SHAPES, classes, prefix="trustedtest", trust_each_other=True) as (other, joiner):
        other.set_state_provider(HONEST.clone)
        other.publish_step(HONEST_STEP)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        fetched = joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0)
    assert fetched is not None, "the joiner refused the state of the run's authorised publisher"
    assert (fetched.step, fetched.hash()) == (HONEST_STEP, HONEST.hash())


def test_an_authorised_publisher_is_still_checked() -> None:
    """Same run as above, but the publisher serves poisoned tensors under the honest step and hash."""
    torch.set_num_threads(1)
    classes = [HashCopyingAverager, DiLoCoAverager]
    with averager_swarm(SHAPES, classes, prefix="trustedbad", trust_each_other=True) as (other, joiner):
        other.set_state_provider(POISON.clone)
        other.publish_step(HONEST_STEP)
        assert wait_until(lambda: list(joiner.peer_steps().values()) == [HONEST_STEP], timeout_s=60)
        assert joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=2.0) is None


def test_a_resync_waits_for_a_source_that_is_still_finishing_the_round() -> None:
    """The only source reaches the step a resync needs after 12 s (a straggler of the same round on
    a loaded machine): the resync waits for it, up to the averaging timeout (a fixed 10 s wait gave
    up first and left two of three trainers diverged in a CI run)."""
    torch.set_num_threads(1)
    classes = [DiLoCoAverager, DiLoCoAverager]
    with averager_swarm(
        SHAPES, classes, prefix="stragglertest", trust_each_other=True, averaging_timeout_s=45.0
    ) as (other, joiner):
        other.set_state_provider(outer_state(0.5, 0).clone)
        other.publish_step(0)
        joiner.prefer_state_sources([other.peer_id])  # as the round they were both in does

        def finish_the_round() -> None:
            other.set_state_provider(HONEST.clone)
            other.publish_step(HONEST_STEP)

        timer = threading.Timer(12.0, finish_the_round)
        timer.start()
        try:
            fetched = joiner.fetch_state(newer_than=0, timeout_s=10.0)
        finally:
            timer.cancel()
    assert fetched is not None, "the resync gave up before the straggler reached the step"
    assert (fetched.step, fetched.hash()) == (HONEST_STEP, HONEST.hash())
