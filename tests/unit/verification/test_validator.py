"""The RL validator on real TinyGPT rollout groups: honest groups accepted with recomputed rewards,
every cheat rejected with its reason, tampering banned, receipts signed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from protocol import rollouts_pb2
from protocol.assignment import derive_assignment
from protocol.envelope import open_envelope
from protocol.errors import InvalidMessage
from protocol.limits import RECEIPT_TTL_S
from protocol.receipts import ReceiptKind, open_receipt
from protocol.rollout_messages import DOMAIN_VERDICT as VERDICT_DOMAIN
from protocol.rollout_messages import open_verdict, rollout_hash
from tests.helpers.rl_workers import ZERO_NONCE
from tests.helpers.validator_setup import (
    ALICE,
    ASYNC,
    BOB,
    GROUP,
    NOW,
    RUN,
    VALIDATOR_ID,
    assert_group_rejected,
    open_verdicts,
    other_seed,
    peer_key,
    reasons,
)
from training.model import ModelConfig, TinyGPT
from verification.validator import VerifiedRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_an_honest_group_is_accepted_with_rewards_recomputed_by_the_validator(
    make_validator, honest, task
) -> None:
    validator = make_validator()
    group = honest(0, 0)
    sealed, accepted = validator.judge_group(ALICE, group)

    verdicts = open_verdicts(sealed)
    assert [v.accepted for v in verdicts] == [True] * GROUP, [(v.reason, v.detail) for v in verdicts]
    assert len(accepted) == GROUP
    assignment = derive_assignment(RUN, 0, ALICE, 0, GROUP, nonce=ZERO_NONCE)
    for i, (verdict, rollout, data) in enumerate(zip(verdicts, accepted, group.rollouts, strict=True)):
        parsed = rollouts_pb2.Rollout.FromString(data)
        expected_reward = task.reward(list(parsed.prompt_ids), list(parsed.completion_ids))
        assert isinstance(rollout, VerifiedRollout)
        assert rollout.worker == ALICE and rollout.policy_version == 0 and rollout.counter == 0
        assert rollout.index == i and rollout.rollout_hash == rollout_hash(data)
        assert rollout.prompt_ids == task.prompt(assignment.prompt_seed)
        assert rollout.completion_ids == list(parsed.completion_ids)
        assert rollout.reward == expected_reward
        assert verdict.worker == ALICE and verdict.rollout_hash == rollout_hash(data)
        assert (verdict.policy_version, verdict.counter, verdict.index) == (0, 0, i)
        assert verdict.tokens == task.max_new_tokens
        assert verdict.reason == ""
        assert verdict.reward == pytest.approx(expected_reward, abs=1e-6)
        assert verdict.issued_at == NOW
    assert len({r.reward for r in accepted}) > 1, "rewards should differ between completions"
    stats = validator.stats()
    assert stats.accepted == GROUP and stats.rejected == {} and stats.groups == 1
    assert stats.workers[ALICE].tokens_accepted == GROUP * task.max_new_tokens


def test_verdicts_are_receipts_signed_by_the_validator_for_thirty_days(make_validator, honest) -> None:
    sealed, _ = make_validator().judge_group(ALICE, honest(0, 0))
    for data in sealed:
        env = open_envelope(data, domain=VERDICT_DOMAIN, run_id=RUN, now=NOW + RECEIPT_TTL_S - 60)
        assert env.signer == VALIDATOR_ID and env.expires_at == NOW + RECEIPT_TTL_S
        with pytest.raises(InvalidMessage, match="expired"):
            open_envelope(data, domain=VERDICT_DOMAIN, run_id=RUN, now=NOW + RECEIPT_TTL_S + 3600)
        with pytest.raises(InvalidMessage, match="another peer"):
            open_envelope(data, domain=VERDICT_DOMAIN, run_id=RUN, signer=ALICE, now=NOW)
        forged = bytearray(data)
        forged[-70] ^= 1  # a byte of the signed body or signature
        with pytest.raises(InvalidMessage):
            open_envelope(bytes(forged), domain=VERDICT_DOMAIN, run_id=RUN, now=NOW)
    assert len({open_envelope(d, domain=VERDICT_DOMAIN, now=NOW).seq for d in sealed}) == GROUP


def test_every_batch_of_verdicts_is_handed_to_on_verdicts_for_the_validators_ledger(
    make_validator, honest
) -> None:
    handed: list[list[bytes]] = []
    validator = make_validator(on_verdicts=handed.append)
    accepted, _ = validator.judge_group(ALICE, honest(0, 0))
    replayed, _ = validator.judge_group(ALICE, honest(0, 0))  # rejected verdicts are receipts too
    assert handed == [accepted, replayed]
    assert set(reasons(replayed)) == {"replay"}


@pytest.mark.parametrize("cheat", [False, True])
def test_the_same_verdict_bytes_open_for_workers_and_for_ledgers(make_validator, honest, cheat) -> None:
    group = honest(0, 0)
    if cheat:  # a rejection carries a reason and a detail, which both openers cap
        group.task = "another-task"
    sealed, _ = make_validator().judge_group(ALICE, group)
    for i, data in enumerate(sealed):
        _, verdict = open_verdict(data, run_id=RUN, validator=VALIDATOR_ID, now=NOW)
        receipt = open_receipt(data, run_id=RUN, kinds=frozenset({ReceiptKind.ROLLOUT}), now=NOW)
        assert verdict.accepted is not cheat and verdict.index == i
        assert (receipt.signer, receipt.contributor, receipt.evidence) == (
            VALIDATOR_ID,
            ALICE,
            verdict.rollout_hash,
        )
        assert (receipt.accepted, receipt.reason, receipt.tokens) == (
            verdict.accepted,
            verdict.reason,
            verdict.tokens,
        )
        late = NOW + RECEIPT_TTL_S - 60  # both keep it for the whole receipt lifetime
        assert open_verdict(data, run_id=RUN, now=late)[1] == verdict
        assert open_receipt(data, run_id=RUN, now=late).receipt_id == receipt.receipt_id


def test_a_group_of_any_held_version_in_the_window_is_accepted(make_validator, alice, policies) -> None:
    validator = make_validator(versions=(0, 1, 2))
    validator.set_trainer_step(2)
    sealed, accepted = validator.judge_group(ALICE, alice.group(policies[1], 1, 0, dtype=torch.float32))
    assert reasons(sealed) == [""] * GROUP and len(accepted) == GROUP


# --- group-level rejections: counted, no ban ---


def test_a_group_for_another_task_is_rejected(make_validator, alice, policies) -> None:
    validator = make_validator()
    group = alice.group(policies[0], 0, 0, task_name="other-task")
    sealed, accepted = validator.judge_group(ALICE, group)
    assert_group_rejected(validator, sealed, accepted, "wrong_task")
    assert len(sealed) == GROUP
    assert not validator.bans.is_banned(ALICE)


@pytest.mark.parametrize("keep", [GROUP - 1, 0])
def test_a_group_of_the_wrong_size_is_rejected(make_validator, honest, keep) -> None:
    validator = make_validator()
    group = honest(0, 0)
    del group.rollouts[keep:]
    sealed, accepted = validator.judge_group(ALICE, group)
    assert_group_rejected(validator, sealed, accepted, "group_size")
    assert len(sealed) == keep


def test_an_oversized_group_gets_a_group_size_verdict_for_every_rollout(make_validator, honest) -> None:
    # the intake answers a submission only with one verdict per rollout: with fewer, a worker started
    # with another --group-size got an error and no reason, and resubmitted forever
    validator = make_validator()
    group = honest(0, 0)
    group.rollouts.extend([b"junk"] * 50)
    sealed, accepted = validator.judge_group(ALICE, group)
    assert_group_rejected(validator, sealed, accepted, "group_size")
    assert len(sealed) == len(group.rollouts) == GROUP + 50


def test_an_unknown_version_is_rejected_and_the_group_may_come_back_once_held(
    make_validator, honest, policies
) -> None:
    validator = make_validator(versions=(0,))
    group = honest(1, 0)
    sealed, accepted = validator.judge_group(ALICE, group)
    assert_group_rejected(validator, sealed, accepted, "unknown_version")
    assert validator.stats().workers[ALICE].groups == 0  # the counter was not used

    validator.add_version(1, policies[1])
    sealed, accepted = validator.judge_group(ALICE, group)
    assert reasons(sealed) == [""] * GROUP and len(accepted) == GROUP


def test_a_stale_group_is_rejected_without_a_ban(make_validator, honest) -> None:
    validator = make_validator(versions=(0,))
    validator.set_trainer_step(ASYNC + 1)
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(validator, sealed, accepted, "stale")
    assert not validator.bans.is_banned(ALICE)
    assert validator.stats().workers[ALICE].rejected == {"stale": GROUP}


def test_at_the_edge_of_the_window_a_group_is_not_stale(make_validator, honest) -> None:
    validator = make_validator(versions=(0,))
    validator.set_trainer_step(ASYNC)
    sealed, _ = validator.judge_group(ALICE, honest(0, 0))
    assert reasons(sealed) == [""] * GROUP


def test_versions_dropped_from_the_window_are_stale(make_validator, honest, policies) -> None:
    validator = make_validator(versions=(0, 1, 2, 3))
    assert validator.held_versions == [1, 2, 3]
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(validator, sealed, accepted, "stale")


def test_a_replayed_counter_is_rejected_without_a_ban(make_validator, honest, alice, policies) -> None:
    validator = make_validator(versions=(0, 1))
    validator.judge_group(ALICE, honest(0, 0))
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(validator, sealed, accepted, "replay")
    # the same counter on another version is the same assignment slot: still a replay
    sealed, accepted = validator.judge_group(ALICE, honest(1, 0))
    assert_group_rejected(validator, sealed, accepted, "replay")
    assert not validator.bans.is_banned(ALICE)
    stats = validator.stats().workers[ALICE]
    assert stats.accepted == GROUP and stats.rejected == {"replay": 2 * GROUP} and stats.groups == 1


def test_a_rollout_submitted_before_is_a_replay(make_validator, honest) -> None:
    validator = make_validator()
    first = honest(0, 0)
    validator.judge_group(ALICE, first)
    again = honest(0, 1)
    again.rollouts[2] = first.rollouts[0]
    sealed, accepted = validator.judge_group(ALICE, again)
    assert_group_rejected(validator, sealed, accepted, "replay")
    # and within one group
    twice = honest(0, 2)
    twice.rollouts[1] = twice.rollouts[0]
    sealed, accepted = validator.judge_group(ALICE, twice)
    assert_group_rejected(validator, sealed, accepted, "replay")


# --- accounting ---


def test_stats_count_every_verdict_per_worker_and_in_total(make_validator, honest, bob, policies) -> None:
    validator = make_validator(versions=(0,))
    validator.judge_group(ALICE, honest(0, 0))
    validator.judge_group(ALICE, honest(0, 0))  # replay
    validator.judge_group(BOB, bob.group(policies[0], 0, 0, tamper=other_seed))
    stats = validator.stats()
    assert stats.workers[ALICE].accepted == GROUP
    assert stats.workers[ALICE].rejected == {"replay": GROUP}
    assert stats.workers[BOB].rejected == {"seed_mismatch": 1, "group_rejected": GROUP - 1}
    assert stats.workers[BOB].strikes == 1 and stats.banned_workers == 1
    assert stats.rejected == {"replay": GROUP, "seed_mismatch": 1, "group_rejected": GROUP - 1}
    assert stats.accepted == GROUP and stats.groups == 2


def test_the_validator_verifies_against_a_copy_of_the_weights(make_validator, honest, policies) -> None:
    model = TinyGPT(ModelConfig())
    model.load_state_dict(policies[0].state_dict())
    validator = make_validator(versions=())
    validator.add_version(0, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the trainer keeps training its model
    sealed, _ = validator.judge_group(ALICE, honest(0, 0))
    assert reasons(sealed) == [""] * GROUP
    with pytest.raises(ValueError, match="already added"):
        validator.add_version(0, model)


def test_the_same_group_judged_concurrently_is_accepted_once(make_validator, honest) -> None:
    validator = make_validator()
    group = honest(0, 0)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: validator.judge_group(ALICE, group), range(2)))
    outcomes = sorted(tuple(reasons(sealed)) for sealed, _ in results)
    assert outcomes == [("",) * GROUP, ("replay",) * GROUP]
    assert sum(len(accepted) for _, accepted in results) == GROUP


def test_a_judged_group_re_encoded_for_another_validator_earns_no_second_credit(
    make_validator, honest
) -> None:
    """Unknown fields added to every rollout give the same content other bytes: the verdicts still name
    the same rollouts, so a ledger counts the work once."""
    from node.ledger.credit import Standing, compute_credit

    group = honest(0, 0)
    first, _ = make_validator().judge_group(ALICE, group)
    re_encoded = rollouts_pb2.RolloutGroup()
    re_encoded.CopyFrom(group)
    for i, data in enumerate(group.rollouts):
        re_encoded.rollouts[i] = data + b"\xa8\x06\x01"  # field 101, varint 1: unknown to the protocol
    assert list(re_encoded.rollouts) != list(group.rollouts)
    other_key, other_id = peer_key(77)
    second, _ = make_validator(private_key=other_key).judge_group(ALICE, re_encoded)
    receipts = [open_receipt(data, run_id=RUN, now=NOW) for data in [*first, *second]]
    assert all(r.accepted for r in receipts)  # a second validator accepts it...
    assert [r.evidence for r in receipts[:GROUP]] == [r.evidence for r in receipts[GROUP:]]
    assert len({r.receipt_id for r in receipts}) == 2 * GROUP
    report = compute_credit(receipts, trusted=[VALIDATOR_ID, other_id], now=NOW)
    standings = [report.standing[r.receipt_id] for r in receipts]
    assert standings.count(Standing.DUPLICATE) == GROUP  # ...but its credit counts once
