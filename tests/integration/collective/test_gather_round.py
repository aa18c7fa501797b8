"""The averaging service end to end on loopback: trainers' rounds over real DHTs and p2pd streams."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch

from node.averaging.rounds import RoundOutcome
from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from node.dht_node import start_loopback_dht
from node.swarm import wait_until

SHAPES = [torch.Size([64, 33]), torch.Size([7])]
PREFIX = "hivenet_diloco_gather_test"


@contextlib.contextmanager
def gather_swarm(n: int, codec: str = "int8", **overrides: float) -> Iterator[list[GatherAverager]]:
    first = start_loopback_dht()
    dhts = [first] + [start_loopback_dht([str(a) for a in first.get_visible_maddrs()]) for _ in range(n - 1)]
    settings = AveragingConfig(
        gather_timeout_s=20.0, commit_timeout_s=5.0, averaging_timeout_s=40.0, request_timeout_s=5.0
    ).model_copy(update=overrides)
    averagers: list[GatherAverager] = []
    try:
        for i, dht in enumerate(dhts):
            averagers.append(
                GatherAverager(
                    SHAPES,
                    dht,
                    prefix=PREFIX,
                    codec=codec_for(codec, SHAPES, density=0.1, chunk_values=64),
                    config=settings,
                    name=f"g{i}",
                )
            )
        yield averagers
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


def run_round(
    averagers: list[GatherAverager], step: int, grads: list[list[torch.Tensor]], hashes: list[str]
) -> list[RoundOutcome]:
    for averager, digest in zip(averagers, hashes, strict=True):
        averager.prepare_round(step, 0.5, digest)
    # A trainer declares its round an outer step's inner steps ahead; here, wait until all see each other.
    assert wait_until(
        lambda: all(
            sorted(a.peer_steps().values()) == [float(step)] * (len(averagers) - 1) for a in averagers
        ),
        timeout_s=60,
    )
    outcomes: list[RoundOutcome | None] = [None] * len(averagers)

    def one(i: int) -> None:
        outcomes[i] = averagers[i].start_average(grads[i], step=step, outer_hash=hashes[i]).result()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(averagers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


@pytest.mark.parametrize("codec", ["int8", "sparse"])
def test_three_trainers_average_to_identical_bits(codec: str) -> None:
    torch.manual_seed(0)
    with gather_swarm(3, codec) as averagers:
        for step in range(2):
            grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in averagers]
            outcomes = run_round(averagers, step, grads, ["00" * 8] * 3)
            for outcome in outcomes:
                assert outcome.num_peers == 3 and outcome.in_sync, outcome
                assert outcome.averaged is not None
            first = outcomes[0].averaged
            assert first is not None
            for outcome in outcomes[1:]:
                assert outcome.averaged is not None
                assert all(torch.equal(a, b) for a, b in zip(first, outcome.averaged, strict=True))
            assert len({o.round_id for o in outcomes}) == 1
            # The aggregate is near the mean of what was sent (exactly it for int8 up to its rounding).
            mean = [torch.stack([g[i] for g in grads]).mean(0) for i in range(len(SHAPES))]
            if codec == "int8":
                assert all(torch.allclose(a, m, atol=1e-3) for a, m in zip(first, mean, strict=True))
        assert all(a.bytes_sent() > 0 for a in averagers)


def test_a_member_with_another_state_is_told_it_is_out_of_sync() -> None:
    with gather_swarm(3) as averagers:
        grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in averagers]
        outcomes = run_round(averagers, 0, grads, ["00" * 8, "00" * 8, "11" * 8])
        assert [o.in_sync for o in outcomes] == [True, True, False]
        assert all(o.num_peers == 3 for o in outcomes)
