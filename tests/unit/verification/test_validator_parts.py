"""The validator's bookkeeping on its own: verdict accounts, the policy-version window, receipts,
and the strict conversion of wire rollouts into claims."""

from __future__ import annotations

import pytest

from protocol import rollouts_pb2
from training.model import ModelConfig, TinyGPT
from training.sampling import SamplingParams
from verification.rollout_checks import completion_length_problem, parse_item
from verification.rollout_wire import WireRejection, claim_from_rollout
from verification.tickets import TicketCounts
from verification.verifier_window import VerifierWindow, VersionStatus
from verification.worker_accounts import WorkerAccounts

# --- verdict accounts ---


def test_accounts_count_verdicts_per_worker_and_join_ticket_counts() -> None:
    accounts = WorkerAccounts()
    accounts.record(b"w1", True, "", 40)
    accounts.record(b"w1", False, "stale", 0)
    accounts.record(b"w2", False, "sampling", 40)
    accounts.record_ban(b"w2", 123.0)
    tickets = {b"w1": TicketCounts(judged=2, abandoned=1, open=0), b"w3": TicketCounts(0, 4, 2)}
    stats = accounts.snapshot({b"w2": 1}, banned={b"w2"}, tickets=tickets)
    assert stats.workers[b"w1"].accepted == 1 and stats.workers[b"w1"].tokens_accepted == 40
    assert stats.workers[b"w1"].rejected == {"stale": 1} and stats.workers[b"w1"].banned_until is None
    assert (stats.workers[b"w1"].groups, stats.workers[b"w1"].abandoned) == (2, 1)
    assert (
        stats.workers[b"w3"].abandoned == 4 and stats.workers[b"w3"].accepted == 0
    )  # tickets, no verdict yet
    assert stats.workers[b"w2"].banned_until == 123.0 and stats.workers[b"w2"].strikes == 1
    assert stats.rejected == {"stale": 1, "sampling": 1} and stats.banned_workers == 1
    assert stats.abandoned == 5 and stats.groups == 2
    assert accounts.snapshot({}, banned=set(), tickets={}).workers[b"w2"].banned_until is None


# --- policy-version window ---


@pytest.fixture(scope="module")
def small_model() -> TinyGPT:
    return TinyGPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32))


def test_the_window_keeps_the_newest_async_level_plus_one_versions(small_model) -> None:
    window = VerifierWindow(async_level=2)
    dropped = [window.add(v, small_model) for v in range(5)]
    assert window.held == [2, 3, 4]
    assert dropped == [[], [], [], [0], [1]]
    assert window.classify(4).status is VersionStatus.HELD and window.classify(4).verifier is not None
    assert window.classify(2).status is VersionStatus.HELD
    assert window.classify(1).status is VersionStatus.STALE
    assert window.classify(7).status is VersionStatus.UNKNOWN
    with pytest.raises(ValueError, match="already added"):
        window.add(1, small_model)


def test_staleness_follows_the_trainer_step(small_model) -> None:
    window = VerifierWindow(async_level=1)
    window.add(3, small_model)
    assert window.classify(3).status is VersionStatus.HELD
    window.trainer_step = 4
    assert window.classify(3).status is VersionStatus.HELD
    window.trainer_step = 5
    assert window.classify(3).status is VersionStatus.STALE
    assert window.classify(5).status is VersionStatus.UNKNOWN  # the trainer is ahead of our weights


def test_a_fully_synchronous_window_holds_one_version(small_model) -> None:
    window = VerifierWindow(async_level=0)
    window.add(0, small_model)
    window.add(1, small_model)
    assert window.held == [1]
    assert window.classify(0).status is VersionStatus.STALE


def test_accepted_hashes_are_forgotten_with_their_version(small_model) -> None:
    window = VerifierWindow(async_level=0)
    window.add(0, small_model)
    window.remember_hashes(0, [b"h0"])
    assert window.seen_hash(b"h0")
    window.add(1, small_model)
    assert not window.seen_hash(b"h0")
    window.remember_hashes(0, [b"late"])  # a dropped version: nothing to remember
    assert not window.seen_hash(b"late")


# --- wire rollouts to claims ---


def _rollout(**fields: object) -> rollouts_pb2.Rollout:
    base: dict[str, object] = dict(
        prompt_ids=[1, 2],
        completion_ids=[3],
        dtype="bfloat16",
        device="cpu",
        temperature=0.7,
        top_p=0.9,
        seed=5,
    )
    base.update(fields)
    return rollouts_pb2.Rollout(**base)  # type: ignore[arg-type]


def test_a_rollout_becomes_a_claim_with_the_runs_exact_sampling_parameters() -> None:
    run = SamplingParams(temperature=0.7, top_p=0.9)
    claim = claim_from_rollout(_rollout(), policy_version=3, sampling=run)
    assert claim.sampling == run  # 0.7 exactly, not the float32 on the wire
    assert (claim.policy_version, claim.seed, claim.dtype) == (3, 5, "bfloat16")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (dict(temperature=0.5), "sampling_params"),
        (dict(top_p=1.0), "sampling_params"),
        (dict(prompt_ids=[]), "malformed_claim"),
        (dict(completion_ids=[]), "malformed_claim"),
        (dict(completion_ids=[2**31]), "malformed_claim"),
        (dict(dtype="int8"), "malformed_claim"),
        (dict(proofs=[b"x" * 5000]), "malformed_claim"),
    ],
)
def test_bad_rollouts_are_rejected_with_a_reason(fields, reason) -> None:
    run = SamplingParams(temperature=0.7, top_p=0.9)
    with pytest.raises(WireRejection) as err:
        claim_from_rollout(_rollout(**fields), policy_version=0, sampling=run)
    assert err.value.reason == reason and err.value.detail


@pytest.mark.parametrize("data", [b"\xff\xff", b"\x0a" * 3, b"\x00" * (8 * 1024 * 1024)])
def test_unparseable_rollouts_are_malformed_claims(data) -> None:
    item = parse_item(2, data)
    assert item.rollout is None and item.reason == "malformed_claim" and item.detail


class _StopTask:
    name, max_new_tokens, stop_ids = "stops", 6, frozenset({10, 11})

    def prompt(self, prompt_seed: int) -> list[int]:
        return [1]

    def reward(self, prompt_ids: object, completion_ids: object) -> float:
        return 0.0


@pytest.mark.parametrize(
    ("completion", "ok"),
    [
        ([1, 2, 3, 4, 5, 6], True),  # the whole budget
        ([1, 2, 10], True),  # ended by the stop token
        ([1, 2, 3, 4, 5, 10], True),
        ([1, 11], True),  # any of the stop tokens
        ([1, 11, 10], False),
        ([1, 2, 3], False),  # cut where it scored best
        ([1, 10, 2, 10], False),  # went on after the stop token
        ([1, 2, 3, 4, 5, 6, 7], False),  # beyond the budget
    ],
)
def test_a_completion_must_end_where_generation_ends(completion: list[int], ok: bool) -> None:
    assert (completion_length_problem(completion, _StopTask()) is None) is ok
