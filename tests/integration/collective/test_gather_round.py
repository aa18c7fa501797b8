"""The averaging service end to end on loopback: trainers' rounds over real DHTs and p2pd streams."""

from __future__ import annotations

import pytest
import torch

from node.collective.codecs import codec_for
from node.swarm import wait_until
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


def test_each_contribution_crosses_each_link_once() -> None:
    """Members that send to each other at once used to each get the other's payload twice (once in
    its request, once in the answer to their own): a round's bytes were twice what a gather needs."""
    shapes = [torch.Size([256, 256])]  # payloads large next to the signed headers and commits
    with gather_swarm(3, shapes=shapes) as averagers:
        payload = averagers[0].rounds.codec.max_payload_bytes()
        for step in range(2):
            grads = [[torch.randn(s) * 0.01 for s in shapes] for _ in averagers]
            run_round(averagers, step, grads, ["00" * 8] * 3)
        for averager in averagers:
            sent = averager.rounds.bytes_sent
            # two rounds, two other members, one payload each, plus headers and commits
            assert 4 * payload <= sent < 4.5 * payload, f"{sent} bytes sent for 4 payloads of {payload}"


def test_a_member_killed_since_the_last_round_does_not_hold_up_the_next() -> None:
    """Last round's members are expected in the next one (their declaration may lag); one that died
    used to be waited for until the gather's deadline, every time a trainer of the run died. The
    deadline here is far beyond the test's patience: the round must end because the dead member
    cannot be reached."""
    with gather_swarm(3, gather_timeout_s=600.0, averaging_timeout_s=600.0) as averagers:
        grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in averagers]
        assert all(o.num_peers == 3 for o in run_round(averagers, 0, grads, ["00" * 8] * 3))
        averagers[2].shutdown()
        dead_dht = averagers[2].rounds.dht
        assert dead_dht is not None
        dead_dht.shutdown()  # with its p2pd: nothing answers at its address any more
        outcomes = run_round(averagers[:2], 1, grads[:2], ["00" * 8] * 2)
        assert [o.num_peers for o in outcomes] == [2, 2]


def test_a_dead_trainers_declaration_lapses_within_its_short_lifetime() -> None:
    """A killed trainer's declaration used to stay listed for two minutes: its stale step held down
    the run's median, which a joiner waits on, and its state was still tried."""
    with gather_swarm(2) as (alive, dead):
        dead.prepare_round(3, 0.0, "00" * 8)
        assert wait_until(lambda: 3.0 in alive.peer_steps().values(), timeout_s=60)
        dead.shutdown()
        assert alive.config.declaration_ttl_s <= 15
        assert wait_until(lambda: not alive.peer_steps(), timeout_s=30), "the dead trainer is still listed"


def test_a_round_averaged_alone_leaves_no_error_feedback_behind() -> None:
    """A trainer that averages alone applies its whole pseudo-gradient; the sparse codec's error
    feedback used to keep what it had not sent of it, so the next round sent that part again (it
    was applied twice). After a lone round, the next contribution is the fresh encoding of the next
    pseudo-gradient."""
    with gather_swarm(2, "sparse", aggregation="mean") as (lonely, other):
        other.prepare_round(5, 0.0, "00" * 8)  # another round: not a member of step 0's
        assert wait_until(lambda: 5.0 in lonely.peer_steps().values(), timeout_s=60)
        first = [torch.randn(s) for s in SHAPES]
        alone = lonely.start_average(first, step=0, outer_hash="00" * 8).result()
        assert alone.num_peers == 1 and alone.averaged is None
        second = [torch.randn(s) for s in SHAPES]
        outcomes = run_round([lonely, other], 1, [second, second], ["00" * 8] * 2)
        assert [o.num_peers for o in outcomes] == [2, 2]
        fresh = codec_for("sparse", SHAPES, density=0.1, chunk_values=64)  # as `other` encodes, first time
        expected = fresh.decode(fresh.encode(second))
        for outcome in outcomes:
            assert outcome.averaged is not None
            assert all(torch.equal(a, e) for a, e in zip(outcome.averaged, expected, strict=True))


def test_a_member_whose_contribution_came_too_late_follows_the_set_the_others_settled_on() -> None:
    """A late member holds the others' contributions, and their commits say they took none of its
    own. Both committed exactly the set of the two of them, so each aggregates that set: the late
    member, a newcomer here, applies it too and holds the same bits (no resync). Where the others'
    commits differ, it cannot know their sets and resyncs (`test_round_book`)."""
    with gather_swarm(3, gather_timeout_s=1.0, min_gather_s=0.0) as (a, b, late):
        for averager in (a, b, late):
            averager.prepare_round(0, 0.0, "00" * 8)
        assert wait_until(lambda: all(list(x.peer_steps().values()) == [0.0, 0.0] for x in (a, b, late)), 60)
        grads = [[torch.randn(s) * 0.01 for s in SHAPES] for _ in range(3)]
        # `late` has not started: it takes their contributions, they end their gather without its own
        early = [x.start_average(g, step=0, outer_hash="00" * 8) for x, g in zip((a, b), grads, strict=False)]
        outcomes = [pending.result() for pending in early]
        outcomes.append(late.start_average(grads[2], step=0, outer_hash="00" * 8).result())
        assert all(o.num_peers == 2 and o.in_sync and o.averaged is not None for o in outcomes), outcomes
        first = outcomes[0].averaged
        assert first is not None
        for outcome in outcomes[1:]:
            assert outcome.averaged is not None
            assert all(torch.equal(x, y) for x, y in zip(first, outcome.averaged, strict=True))
