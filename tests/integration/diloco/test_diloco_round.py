"""One DiLoCo averaging round on loopback: triggering a round whose group is already assembled
does not wait on a DHT lookup (the all-reduce starts at once, whatever the DHT's latency), and its
outcome names the group and the bytes received from each other member (for training receipts); a
round that most live peers have moved past is given up at once and reported out of sync."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from hivemind.averaging.control import AveragingStage

from node.averaging.averager import DiLoCoAverager
from node.averaging.rounds import RoundOutcome
from node.averaging.runner import global_norm
from node.swarm import wait_until
from tests.helpers.trainers import averager_swarm, round_test_settings

SHAPES = [torch.Size([64]), torch.Size([8, 8])]


@pytest.fixture()
def pair() -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings(
        "roundtest", 2, matchmaking_time_s=1.0, averaging_timeout_s=30.0, sender_timeout_s=10.0
    )
    with averager_swarm(SHAPES, [DiLoCoAverager] * 2, **kwargs) as averagers:
        yield averagers


def test_an_assembled_group_is_triggered_without_a_dht_lookup(pair: list[DiLoCoAverager]) -> None:
    for a in pair:
        a.prepare_round(1, 1.0, "same-hash")
    assert wait_until(
        lambda: all(
            a._control is not None and a._control.stage == AveragingStage.AWAITING_TRIGGER for a in pair
        ),
        timeout_s=60,
    )
    lookups = [0, 0]

    def counting(i: int, original: Callable[[], dict[bytes, float]]) -> Callable[[], dict[bytes, float]]:
        def peer_steps() -> dict[bytes, float]:
            lookups[i] += 1
            return original()

        return peer_steps

    for i, a in enumerate(pair):
        a.peer_steps = counting(i, a.peer_steps)  # type: ignore[method-assign]
    outcomes: list[RoundOutcome | None] = [None, None]

    def go(i: int) -> None:
        grads = [torch.full(s, 1.0 + 2.0 * i) for s in SHAPES]
        outcomes[i] = pair[i].average(grads, step=1, outer_hash="same-hash")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    first, second = outcomes
    assert first is not None and second is not None and first.num_peers == second.num_peers == 2
    assert first.averaged is not None and second.averaged is not None
    assert all(torch.equal(x, torch.full_like(x, 2.0)) for x in first.averaged)
    assert lookups == [0, 0], "a ready group waited on a DHT lookup before its all-reduce"
    # what training receipts are signed from: the group's id, and the bytes each member got from the other
    assert first.round_id == second.round_id and len(first.round_id) == 20
    for outcome, other in ((first, pair[1]), (second, pair[0])):
        assert list(outcome.received_bytes) == [other.peer_id.to_bytes()]
        assert outcome.received_bytes[other.peer_id.to_bytes()] > 0


def test_a_round_the_live_peers_have_moved_past_is_given_up_out_of_sync(pair: list[DiLoCoAverager]) -> None:
    """A trainer left behind by the run (it missed a round's group: seen in the churn soak) must
    resync: stepping alone on its own pseudo-gradient gives a state nobody else holds, and a
    trainer that kept it stepped alone round after round while the run went on without it."""
    behind, ahead = pair
    ahead.publish_step(5)
    assert wait_until(lambda: list(behind.peer_steps().values()) == [5.0], timeout_s=60)
    ours = [torch.ones(s) for s in SHAPES]
    outcome = behind.average(ours, step=2, outer_hash="behind-hash")
    assert outcome.averaged is None and outcome.num_peers == 1
    assert not outcome.in_sync, "a trainer behind the run kept its lone outer step as the run's"
    # It never averaged with a group: its own pseudo-gradient sets the scale of its next norm bound
    # (the resync may leave that round few inner steps; a tiny bound refused honest peers).
    assert behind._last_average_norm.value == pytest.approx(global_norm(ours))


def test_a_peer_still_advertising_an_older_step_does_not_hold_back_giving_up() -> None:
    """Under churn a dead peer's advertisement outlives it (and a stalled peer's lags): most live
    peers past our round is enough to give it up. Waiting for every peer made a trainer that missed
    one group wait out the whole timeout and step alone, round after round, in the churn soak."""
    torch.set_num_threads(1)
    kwargs = round_test_settings(
        "lagtest", 2, matchmaking_time_s=1.0, averaging_timeout_s=30.0, sender_timeout_s=10.0
    )
    with averager_swarm(SHAPES, [DiLoCoAverager] * 4, **kwargs) as (behind, ahead1, ahead2, stale):
        ahead1.publish_step(5)
        ahead2.publish_step(5)
        stale.publish_step(1)
        assert wait_until(lambda: sorted(behind.peer_steps().values()) == [1.0, 5.0, 5.0], timeout_s=60)
        outcome = behind.average([torch.ones(s) for s in SHAPES], step=2, outer_hash="behind-hash")
        assert outcome.num_peers == 1
        assert not outcome.in_sync, "an old advertisement kept a trainer left behind on its lone outer step"
