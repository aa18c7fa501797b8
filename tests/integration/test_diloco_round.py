"""One DiLoCo averaging round on loopback: triggering a round whose group is already assembled
does not wait on a DHT lookup (the all-reduce starts at once, whatever the DHT's latency)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from hivemind import DHT
from hivemind.averaging.control import AveragingStage

from node.swarm import wait_until
from node.trainer_averaging import DiLoCoAverager
from training.diloco import RoundOutcome

SHAPES = [torch.Size([64]), torch.Size([8, 8])]


@pytest.fixture()
def pair() -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    dhts: list[DHT] = []
    averagers: list[DiLoCoAverager] = []
    try:
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
        peers = [str(a) for a in dhts[0].get_visible_maddrs()]
        for i in range(2):
            dht = DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
            dhts.append(dht)
            averagers.append(
                DiLoCoAverager(
                    SHAPES,
                    dht,
                    prefix="roundtest",
                    compression="fp32",
                    matchmaking_time_s=1.0,
                    request_timeout_s=0.5,
                    averaging_timeout_s=30.0,
                    sender_timeout_s=10.0,
                    target_group_size=2,
                    name=f"peer{i}",
                )
            )
        for a in averagers:
            a.publish_step(0)
        assert wait_until(lambda: all(len(a.peer_steps()) == 1 for a in averagers), timeout_s=60)
        yield averagers
    finally:
        for a in averagers:
            a.shutdown()
        for d in reversed(dhts):
            d.shutdown()


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
