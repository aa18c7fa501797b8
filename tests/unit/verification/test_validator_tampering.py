"""The RL validator against tampering workers: every kind of tampering is rejected with its reason
and bans the worker (the ban's end on record in the verdict that proved it), bans grow, and
someone else's assignment is no use to a thief."""

from __future__ import annotations

import pytest
import torch

from node.bans import BanList
from tests.helpers.rl_workers import FakeTask, Generated
from tests.helpers.validator_setup import (
    ALICE,
    BOB,
    GROUP,
    TOPLOC_REASONS,
    FakeClock,
    assert_group_rejected,
    drop_a_proof,
    open_verdicts,
    other_seed,
    reasons,
)
from training.sampling import SamplingParams
from verification.validator import BANNING_REASONS, Validator
from verification.verdict import RejectReason

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- per-rollout rejections: tampering is banned ---


def _assert_tampering(validator: Validator, worker: bytes, sealed, accepted, expected: set[str]) -> None:
    """The group is rejected: some rollouts for a reason in `expected`, the others group_rejected."""
    assert accepted == []
    got = reasons(sealed)
    culprits = [r for r in got if r != "group_rejected"]
    assert culprits and set(culprits) <= expected, got
    assert set(culprits) <= BANNING_REASONS
    assert validator.bans.is_banned(worker)
    banned_until = validator.stats().workers[worker].banned_until
    assert banned_until is not None
    # the ban is on record: the verdict of the rollout that proved the tampering carries its end
    announced = [(v.reason, v.banned_until) for v in open_verdicts(sealed) if v.banned_until]
    assert len(announced) == 1 and announced[0][0] in expected, announced
    assert announced[0][1] == pytest.approx(banned_until)


def _edit_completion_for_a_better_reward(index: int, gen: Generated) -> None:
    if index == 1:
        gen.completion_ids = [t % 128 for t in gen.completion_ids]  # every byte "low": reward 1.0


def test_a_completion_edited_for_a_better_reward_is_rejected_and_banned(
    make_validator, alice, policies
) -> None:
    validator = make_validator()
    group = alice.group(policies[0], 0, 0, tamper=_edit_completion_for_a_better_reward)
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_tampering(validator, ALICE, sealed, accepted, TOPLOC_REASONS | {RejectReason.SAMPLING})


def test_a_completion_cut_short_with_honest_proofs_is_rejected(make_validator, alice, policies, task) -> None:
    validator = make_validator()
    group = alice.group(policies[0], 0, 0, max_new_tokens=task.max_new_tokens - 7)
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_tampering(validator, ALICE, sealed, accepted, {"completion_length"})


def _other_prompt(index: int, gen: Generated) -> None:
    if index == 0:
        gen.prompt_ids = [*gen.prompt_ids[:-1], (gen.prompt_ids[-1] + 1) % 256]


def _huge_token(index: int, gen: Generated) -> None:
    if index == 0:
        gen.completion_ids = [*gen.completion_ids[:-1], 2**31 + 5]


def _bad_dtype(index: int, gen: Generated) -> None:
    if index == 1:
        gen.dtype = "float8"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (dict(tamper=other_seed), {"seed_mismatch"}),
        # one proof per 32 tokens is structure: the transport's parse refuses it before any TOPLOC check
        (dict(tamper=drop_a_proof), {"malformed_claim"}),
        (dict(tamper=_other_prompt), {"prompt_mismatch"}),
        (dict(tamper=_huge_token), {"malformed_claim"}),
        (dict(tamper=_bad_dtype), {"malformed_claim"}),
        (dict(choose=lambda i, logits, sampled: int(logits.argmax())), {"sampling"}),
        (dict(dtype=torch.float32, tamper=lambda i, g: setattr(g, "dtype", "bfloat16")), TOPLOC_REASONS),
        (dict(sampling=SamplingParams(temperature=0.5)), {"sampling_params"}),
    ],
    ids=["seed", "proofs", "prompt", "token_id", "dtype", "greedy", "precision_swap", "temperature"],
)
def test_each_kind_of_tampering_is_rejected_and_banned(
    make_validator, alice, policies, case, expected
) -> None:
    validator = make_validator()
    sealed, accepted = validator.judge_group(ALICE, alice.group(policies[0], 0, 0, **case))
    _assert_tampering(validator, ALICE, sealed, accepted, expected)


def test_rollouts_generated_by_other_weights_are_rejected(make_validator, alice, policies) -> None:
    validator = make_validator(versions=(0,))
    group = alice.group(policies[3], 0, 0)  # claims version 0, generated with other weights
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_tampering(validator, ALICE, sealed, accepted, TOPLOC_REASONS)


def test_unparseable_rollout_bytes_are_a_malformed_claim(make_validator, honest) -> None:
    validator = make_validator()
    group = honest(0, 0)
    group.rollouts[1] = b"\xff\xff\xff"
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_tampering(validator, ALICE, sealed, accepted, {"malformed_claim"})


def test_someone_elses_assignment_is_a_prompt_mismatch_and_the_owner_keeps_it(
    make_validator, honest, bob, policies
) -> None:
    validator = make_validator()
    alices_group = honest(0, 0)
    sealed, accepted = validator.judge_group(BOB, alices_group)
    _assert_tampering(validator, BOB, sealed, accepted, {"prompt_mismatch", "seed_mismatch"})
    # A worker generating honestly for another worker's assignment is caught the same way.
    validator2 = make_validator()
    stolen = bob.group(policies[0], 0, 5, as_worker=ALICE)
    sealed, accepted = validator2.judge_group(BOB, stolen)
    _assert_tampering(validator2, BOB, sealed, accepted, {"prompt_mismatch", "seed_mismatch"})
    # Alice still gets her own assignment judged (Bob's theft used no counter of hers).
    sealed, accepted = validator.judge_group(ALICE, alices_group)
    assert reasons(sealed) == [""] * GROUP and len(accepted) == GROUP
    assert not validator.bans.is_banned(ALICE)


def test_a_banned_worker_is_refused_and_bans_grow(
    make_validator, alice, bob, policies, honest, clock: FakeClock
) -> None:
    bans = BanList(base_s=0.05, max_s=10.0, owner="test", clock=clock)
    validator = make_validator(bans=bans)
    tampered, honest_next, tampered_again = (
        bob.group(policies[0], 0, 0, tamper=other_seed),
        bob.group(policies[0], 0, 1),
        bob.group(policies[0], 0, 2, tamper=drop_a_proof),
    )
    validator.judge_group(BOB, tampered)
    assert bans.strikes(BOB) == 1

    sealed, accepted = validator.judge_group(BOB, honest_next)
    assert_group_rejected(validator, sealed, accepted, "banned")
    assert bans.strikes(BOB) == 1  # refusing a banned worker is not another strike
    clock.now += 0.06  # past the first ban
    assert not bans.is_banned(BOB)

    assert validator.stats().workers[BOB].banned_until is None
    validator.judge_group(BOB, tampered_again)
    assert bans.strikes(BOB) == 2
    stats = validator.stats().workers[BOB]
    assert stats.strikes == 2
    assert stats.banned_until == pytest.approx(clock.now + 0.1)  # twice the first ban
    assert bans.reasons["seed_mismatch"] == 1 and bans.reasons["malformed_claim"] == 1
    # Alice is unaffected
    sealed, _ = validator.judge_group(ALICE, honest(0, 0))
    assert reasons(sealed) == [""] * GROUP


def test_a_task_that_cannot_score_rejects_the_group_without_a_ban(make_validator, honest) -> None:
    class BrokenTask(FakeTask):
        def reward(self, prompt_ids, completion_ids) -> float:
            return 2.0

    validator = make_validator(task=BrokenTask())
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert accepted == [] and set(reasons(sealed)) <= {"reward_error", "group_rejected"}
    assert not validator.bans.is_banned(ALICE)
