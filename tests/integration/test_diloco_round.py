"""One DiLoCo averaging round on loopback: triggering a round whose group is already assembled
does not wait on a DHT lookup (the all-reduce starts at once, whatever the DHT's latency), and its
outcome names the group and the bytes received from each other member (for training receipts)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from hivemind.averaging.control import AveragingStage

from node.averaging.averager import DiLoCoAverager
from node.averaging.rounds import RoundOutcome
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
