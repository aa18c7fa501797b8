"""The RL validator on real TinyGPT rollout groups: honest groups accepted with recomputed rewards,
every cheat rejected with its reason, tampering banned, receipts signed."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.bans import BanList
from protocol import rollouts_pb2
from protocol.assignment import derive_assignment
from protocol.envelope import open_envelope
from protocol.errors import InvalidMessage
from protocol.limits import RECEIPT_TTL_S
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import ReceiptKind, open_receipt
from protocol.rollout_messages import DOMAIN_VERDICT as VERDICT_DOMAIN
from protocol.rollout_messages import open_verdict, rollout_hash
from tests.verification.rl_workers import FakeTask, Generated, RLWorker
from training.model import ModelConfig, TinyGPT
from training.sampling import SamplingParams
from verification.validator import BANNING_REASONS, Validator, VerifiedRollout
from verification.verdict import RejectReason

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RUN = "rl-test-run"
GROUP = 3
ASYNC = 2
NOW = 1_800_000_000.0
TOPLOC_REASONS: set[str] = {
    RejectReason.TOPLOC_EXPONENT,
    RejectReason.TOPLOC_SIGN,
    RejectReason.TOPLOC_MANTISSA,
    RejectReason.TOPLOC_VALUES,
}


class FakeClock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def _peer(seed: int) -> tuple[Ed25519PrivateKey, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    return key, peer_id_from_private_key(key)


VALIDATOR_KEY, VALIDATOR_ID = _peer(1)
_, ALICE = _peer(2)
_, BOB = _peer(3)


@pytest.fixture(scope="module")
def task() -> FakeTask:
    return FakeTask()


@pytest.fixture(scope="module")
def policies() -> dict[int, TinyGPT]:
    """Policy weights per version (each version its own random weights)."""
    out = {}
    for v in range(6):
        torch.manual_seed(v)
        out[v] = TinyGPT(ModelConfig()).eval()
    return out


@pytest.fixture(scope="module")
def alice(task: FakeTask) -> RLWorker:
    return RLWorker(ALICE, run_id=RUN, task=task, group_size=GROUP)


@pytest.fixture(scope="module")
def bob(task: FakeTask) -> RLWorker:
    return RLWorker(BOB, run_id=RUN, task=task, group_size=GROUP)


@pytest.fixture(scope="module")
def honest(alice: RLWorker, policies: dict[int, TinyGPT]) -> Callable[[int, int], rollouts_pb2.RolloutGroup]:
    """Alice's honest group for (version, counter), generated once per module and copied."""
    cache: dict[tuple[int, int], bytes] = {}

    def build(version: int, counter: int) -> rollouts_pb2.RolloutGroup:
        if (version, counter) not in cache:
            cache[(version, counter)] = alice.group(policies[version], version, counter).SerializeToString()
        return rollouts_pb2.RolloutGroup.FromString(cache[(version, counter)])

    return build


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_validator(
    task: FakeTask, policies: dict[int, TinyGPT], clock: FakeClock
) -> Callable[..., Validator]:
    def make(versions: tuple[int, ...] = (0,), **kwargs: object) -> Validator:
        kwargs.setdefault("task", task)
        v = Validator(
            private_key=VALIDATOR_KEY,
            run_id=RUN,
            group_size=GROUP,
            async_level=ASYNC,
            clock=clock,
            **kwargs,  # type: ignore[arg-type]
        )
        for version in versions:
            v.add_version(version, policies[version])
        return v

    return make


def open_verdicts(sealed: list[bytes]) -> list[rollouts_pb2.RolloutVerdict]:
    out = []
    for data in sealed:
        env = open_envelope(data, domain=VERDICT_DOMAIN, run_id=RUN, signer=VALIDATOR_ID, now=NOW)
        out.append(rollouts_pb2.RolloutVerdict.FromString(env.payload))
    return out


def reasons(sealed: list[bytes]) -> list[str]:
    return [v.reason for v in open_verdicts(sealed)]


# --- honest groups ---


def test_an_honest_group_is_accepted_with_rewards_recomputed_by_the_validator(
    make_validator, honest, task
) -> None:
    validator = make_validator()
    group = honest(0, 0)
    sealed, accepted = validator.judge_group(ALICE, group)

    verdicts = open_verdicts(sealed)
    assert [v.accepted for v in verdicts] == [True] * GROUP, [(v.reason, v.detail) for v in verdicts]
    assert len(accepted) == GROUP
    assignment = derive_assignment(RUN, 0, ALICE, 0, GROUP)
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


def _assert_group_rejected(validator: Validator, sealed: list[bytes], accepted: list, reason: str) -> None:
    assert accepted == []
    verdicts = open_verdicts(sealed)
    assert [v.reason for v in verdicts] == [reason] * len(verdicts)
    assert all(not v.accepted and v.reward == 0.0 and v.detail for v in verdicts)
    assert all(v.banned_until == 0.0 for v in verdicts)  # no ban, so no verdict announces one


def test_a_group_for_another_task_is_rejected(make_validator, alice, policies) -> None:
    validator = make_validator()
    group = alice.group(policies[0], 0, 0, task_name="other-task")
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_group_rejected(validator, sealed, accepted, "wrong_task")
    assert len(sealed) == GROUP
    assert not validator.bans.is_banned(ALICE)


@pytest.mark.parametrize("keep", [GROUP - 1, 0])
def test_a_group_of_the_wrong_size_is_rejected(make_validator, honest, keep) -> None:
    validator = make_validator()
    group = honest(0, 0)
    del group.rollouts[keep:]
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_group_rejected(validator, sealed, accepted, "group_size")
    assert len(sealed) == keep


def test_an_oversized_group_gets_at_most_group_size_verdicts(make_validator, honest) -> None:
    validator = make_validator()
    group = honest(0, 0)
    group.rollouts.extend([b"junk"] * 50)
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_group_rejected(validator, sealed, accepted, "group_size")
    assert len(sealed) == GROUP


def test_an_unknown_version_is_rejected_and_the_group_may_come_back_once_held(
    make_validator, honest, policies
) -> None:
    validator = make_validator(versions=(0,))
    group = honest(1, 0)
    sealed, accepted = validator.judge_group(ALICE, group)
    _assert_group_rejected(validator, sealed, accepted, "unknown_version")
    assert validator.stats().workers[ALICE].groups == 0  # the counter was not used

    validator.add_version(1, policies[1])
    sealed, accepted = validator.judge_group(ALICE, group)
    assert reasons(sealed) == [""] * GROUP and len(accepted) == GROUP


def test_a_stale_group_is_rejected_without_a_ban(make_validator, honest) -> None:
    validator = make_validator(versions=(0,))
    validator.set_trainer_step(ASYNC + 1)
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    _assert_group_rejected(validator, sealed, accepted, "stale")
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
    _assert_group_rejected(validator, sealed, accepted, "stale")


def test_a_replayed_counter_is_rejected_without_a_ban(make_validator, honest, alice, policies) -> None:
    validator = make_validator(versions=(0, 1))
    validator.judge_group(ALICE, honest(0, 0))
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    _assert_group_rejected(validator, sealed, accepted, "replay")
    # the same counter on another version is the same assignment slot: still a replay
    sealed, accepted = validator.judge_group(ALICE, honest(1, 0))
    _assert_group_rejected(validator, sealed, accepted, "replay")
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
    _assert_group_rejected(validator, sealed, accepted, "replay")
    # and within one group
    twice = honest(0, 2)
    twice.rollouts[1] = twice.rollouts[0]
    sealed, accepted = validator.judge_group(ALICE, twice)
    _assert_group_rejected(validator, sealed, accepted, "replay")


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


def _other_seed(index: int, gen: Generated) -> None:
    if index == 2:
        gen.seed += 1


def _drop_a_proof(index: int, gen: Generated) -> None:
    if index == 0:
        gen.proofs = gen.proofs[:-1]


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
        (dict(tamper=_other_seed), {"seed_mismatch"}),
        # one proof per 32 tokens is structure: the transport's parse refuses it before any TOPLOC check
        (dict(tamper=_drop_a_proof), {"malformed_claim"}),
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


def test_a_banned_worker_is_refused_and_bans_grow(make_validator, alice, bob, policies, honest) -> None:
    bans = BanList(base_s=0.05, max_s=10.0, owner="test")
    validator = make_validator(bans=bans)
    tampered, honest_next, tampered_again = (
        bob.group(policies[0], 0, 0, tamper=_other_seed),
        bob.group(policies[0], 0, 1),
        bob.group(policies[0], 0, 2, tamper=_drop_a_proof),
    )
    validator.judge_group(BOB, tampered)
    assert bans.strikes(BOB) == 1

    sealed, accepted = validator.judge_group(BOB, honest_next)
    if bans.is_banned(BOB):  # the ban may already be over on a slow machine
        _assert_group_rejected(validator, sealed, accepted, "banned")
        assert bans.strikes(BOB) == 1  # refusing a banned worker is not another strike
    deadline = time.monotonic() + 5.0
    while bans.is_banned(BOB) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not bans.is_banned(BOB)

    assert validator.stats().workers[BOB].banned_until is None
    validator.judge_group(BOB, tampered_again)
    assert bans.strikes(BOB) == 2
    stats = validator.stats().workers[BOB]
    assert stats.strikes == 2
    assert stats.banned_until == pytest.approx(NOW + 0.1)  # twice the first ban
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


# --- accounting ---


def test_skipped_counters_are_counted_as_abandoned_until_they_arrive(make_validator, honest) -> None:
    validator = make_validator()
    for counter in (0, 2, 5):
        sealed, _ = validator.judge_group(ALICE, honest(0, counter))
        assert reasons(sealed) == [""] * GROUP
    assert validator.stats().workers[ALICE].abandoned == 3  # 1, 3, 4
    sealed, _ = validator.judge_group(ALICE, honest(0, 3))  # arrives late: still judged
    assert reasons(sealed) == [""] * GROUP
    stats = validator.stats()
    assert stats.workers[ALICE].abandoned == 2 and stats.abandoned == 2
    assert stats.workers[ALICE].groups == 4 and stats.accepted == 4 * GROUP


def test_stats_count_every_verdict_per_worker_and_in_total(make_validator, honest, bob, policies) -> None:
    validator = make_validator(versions=(0,))
    validator.judge_group(ALICE, honest(0, 0))
    validator.judge_group(ALICE, honest(0, 0))  # replay
    validator.judge_group(BOB, bob.group(policies[0], 0, 0, tamper=_other_seed))
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


def test_a_counter_far_behind_the_highest_is_settled(make_validator, honest) -> None:
    validator = make_validator(late_window=2)
    for counter in (0, 5):
        validator.judge_group(ALICE, honest(0, counter))
    sealed, accepted = validator.judge_group(ALICE, honest(0, 2))  # 3 behind, window of 2
    _assert_group_rejected(validator, sealed, accepted, "replay")
    assert validator.stats().workers[ALICE].abandoned == 4
