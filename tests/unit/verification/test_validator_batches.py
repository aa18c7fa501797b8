"""A validator judging several groups in one batch gives the verdicts of judging them one after another."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from protocol import rollouts_pb2
from tests.helpers.validator_setup import ALICE, BOB, GROUP, open_verdicts, other_seed, reasons
from verification import validator as validator_module
from verification.validator import Validator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _outcome(validator: Validator, judged: list[tuple[list[bytes], list]]) -> tuple[object, ...]:
    """What a batch decided: every verdict (but its sequence number), every accepted rollout, the stats."""
    verdicts = [
        [(v.worker, v.rollout_hash, v.counter, v.index, v.accepted, v.reason, v.detail, v.reward, v.tokens)
         for v in open_verdicts(sealed)]
        for sealed, _ in judged
    ]  # fmt: skip
    accepted = [[(r.rollout_hash, r.reward, r.completion_ids) for r in rollouts] for _, rollouts in judged]
    stats = validator.stats()
    return verdicts, accepted, stats.accepted, stats.rejected, stats.abandoned, stats.banned_workers


def test_a_batch_of_mixed_groups_gets_the_verdicts_of_one_group_after_another(
    make_validator, honest, bob, policies
) -> None:
    replayed_counter = honest(0, 0)
    submissions: list[tuple[bytes, rollouts_pb2.RolloutGroup]] = [
        (ALICE, honest(0, 0)),
        (BOB, bob.group(policies[0], 0, 0, tamper=other_seed)),  # rejected and banned
        (ALICE, honest(1, 1)),  # another version: another verifier, the same batch
        (ALICE, replayed_counter),  # counter 0 again: a replay
        (ALICE, honest(0, 3)),  # counter 2 skipped: abandoned
        (BOB, bob.group(policies[0], 0, 1)),  # banned by its group before it in the batch
    ]
    one_by_one = make_validator(versions=(0, 1))
    sequential = [one_by_one.judge_group(worker, group) for worker, group in submissions]
    batched = make_validator(versions=(0, 1))
    together = batched.judge_groups(submissions)

    assert _outcome(batched, together) == _outcome(one_by_one, sequential)
    assert [set(reasons(sealed)) for sealed, _ in together] == [
        {""}, {"seed_mismatch", "group_rejected"}, {""}, {"replay"}, {""}, {"banned"}
    ]  # fmt: skip


def test_a_rollout_in_two_groups_of_a_batch_is_accepted_once(make_validator, honest) -> None:
    first = honest(0, 0)
    copier = honest(0, 1)
    copier.rollouts[2] = first.rollouts[0]
    validator = make_validator()
    (sealed_first, accepted_first), (sealed_copier, accepted_copier) = validator.judge_groups(
        [(ALICE, first), (ALICE, copier)]
    )
    assert reasons(sealed_first) == [""] * GROUP and len(accepted_first) == GROUP
    assert set(reasons(sealed_copier)) == {"replay"} and accepted_copier == []


def test_a_rollout_in_two_groups_is_judged_again_if_its_first_group_was_rejected(
    make_validator, honest, alice, policies
) -> None:
    cheat = alice.group(policies[0], 0, 0, tamper=other_seed)
    honest_again = honest(0, 1)
    honest_again.rollouts[1] = cheat.rollouts[1]  # a rollout of the rejected group: never accepted
    validator = make_validator()
    together = validator.judge_groups([(ALICE, cheat), (ALICE, honest_again)])
    one_by_one = make_validator()
    sequential = [one_by_one.judge_group(ALICE, group) for group in (cheat, honest_again)]
    assert _outcome(validator, together) == _outcome(one_by_one, sequential)
    assert set(reasons(together[1][0])) == {"banned"}  # the first group's ban came first


def test_a_counter_or_rollout_being_judged_is_a_replay_for_a_concurrent_submission(
    make_validator, honest, monkeypatch
) -> None:
    """While a batch is verified, its counters (even a stale group's) and rollouts are taken."""
    validator = make_validator(versions=(0, 1, 2, 3))  # version 0 fell out of the window: stale
    stale, fresh = honest(0, 5), honest(3, 6)
    copied = honest(3, 7)
    copied.rollouts[0] = fresh.rollouts[0]
    entered, release = threading.Event(), threading.Event()
    real_check = validator_module.check_groups

    def held_check(*args, **kwargs) -> None:
        entered.set()
        assert release.wait(30.0)
        real_check(*args, **kwargs)

    monkeypatch.setattr(validator_module, "check_groups", held_check)
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(validator.judge_groups, [(ALICE, stale), (ALICE, fresh)])
        assert entered.wait(30.0)
        monkeypatch.setattr(validator_module, "check_groups", real_check)
        same_counter = honest(3, 5)
        assert set(reasons(validator.judge_group(ALICE, same_counter)[0])) == {"replay"}
        assert set(reasons(validator.judge_group(ALICE, copied)[0])) == {"replay"}
        release.set()
        (stale_sealed, _), (fresh_sealed, fresh_accepted) = first.result(30.0)
    assert set(reasons(stale_sealed)) == {"stale"}
    assert reasons(fresh_sealed) == [""] * GROUP and len(fresh_accepted) == GROUP
    # nothing stays reserved: the copier's counter is free again, its copied rollout now accepted before
    assert set(reasons(validator.judge_group(ALICE, copied)[0])) == {"replay"}
    assert reasons(validator.judge_group(ALICE, honest(3, 8))[0]) == [""] * GROUP
