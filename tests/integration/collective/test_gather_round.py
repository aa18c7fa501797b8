"""The averaging service end to end on loopback: trainers' rounds over real DHTs and p2pd streams."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.gather import SHAPES, gather_swarm, run_round


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
