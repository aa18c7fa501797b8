"""Credit: totals per role, the recent average's half-life, one count per piece of work, and sybils."""

from __future__ import annotations

import time

import pytest

from node.ledger.credit import DEFAULT_HALF_LIFE_S, CreditRates, Standing, compute_credit
from node.ledger.signers import RunSigners
from protocol.receipts import Receipt, ReceiptKind, open_receipt, receipt_id
from tests.helpers import receipts as make
from tests.helpers.receipts import new_peer

NOW = time.time()


def _open(*envelopes: bytes) -> list[Receipt]:
    return [open_receipt(data) for data in envelopes]


def test_each_kind_credits_its_role() -> None:
    key, signer = new_peer()
    _, peer = new_peer()
    receipts = _open(
        make.verdict(key, peer, tokens=50),
        make.verdict(key, peer, tokens=999, accepted=False, reason="toploc_mantissa"),
        make.training(key, peer, tokens=2000),
        make.transfer(key, peer, byte_count=3 << 20),
        make.seed(key, peer),
        make.validation(key, peer, tokens=800),
    )
    report = compute_credit(receipts, trusted=[signer], now=NOW)
    roles = report.contributors[peer].roles
    rates = CreditRates()
    assert roles["validator"].total == 800 * rates.per_token_validated
    assert roles["inference"].total == 50 * rates.per_token_generated
    assert roles["inference"].receipts == 2
    assert roles["trainer"].total == 2000 * rates.per_token_trained
    assert roles["broadcast"].total == pytest.approx(3 * rates.per_mib_delivered)
    assert roles["seed"].total == rates.per_seed_service
    assert report.standing[receipts[1].receipt_id] is Standing.REJECTED


def test_recent_average_halves_after_one_half_life() -> None:
    key, signer = new_peer()
    _, peer = new_peer()
    receipts = _open(make.training(key, peer, tokens=1000, issued_at=NOW - 10))
    half_life = 3600.0
    at_issue = compute_credit(receipts, trusted=[signer], now=NOW - 10, half_life_s=half_life)
    later = compute_credit(receipts, trusted=[signer], now=NOW - 10 + half_life, half_life_s=half_life)
    two_later = compute_credit(
        receipts, trusted=[signer], now=NOW - 10 + 2 * half_life, half_life_s=half_life
    )
    first = at_issue.contributors[peer].recent
    assert first > 0
    assert later.contributors[peer].recent == pytest.approx(first / 2)
    assert two_later.contributors[peer].recent == pytest.approx(first / 4)
    assert later.contributors[peer].total == at_issue.contributors[peer].total == 1000


def test_steady_rate_shows_as_points_per_day() -> None:
    key, signer = new_peer()
    _, peer = new_peer()
    hours = 24 * 14  # two weeks of one receipt an hour, 100 points each: 2,400 points a day
    receipts = _open(*(make.training(key, peer, tokens=100, issued_at=NOW - h * 3600) for h in range(hours)))
    report = compute_credit(receipts, trusted=[signer], now=NOW, half_life_s=DEFAULT_HALF_LIFE_S)
    assert report.contributors[peer].recent == pytest.approx(2400, rel=0.05)


def test_the_same_work_counts_once() -> None:
    """Every member of an averaging group signs a trainer's round, two validators judge one rollout."""
    (k1, s1), (k2, s2) = new_peer(), new_peer()
    _, trainer = new_peer()
    round_id, rollout = b"round-9", b"r" * 32
    receipts = _open(
        make.training(k1, trainer, tokens=500, round_id=round_id),
        make.training(k2, trainer, tokens=500, round_id=round_id),
        make.verdict(k1, trainer, tokens=40, rollout_hash=rollout),
        make.verdict(k2, trainer, tokens=40, rollout_hash=rollout),
    )
    report = compute_credit(receipts, trusted=[s1, s2], now=NOW)
    assert report.contributors[trainer].total == 540
    assert report.standing_counts()["duplicate"] == 2


def test_sybil_receipts_count_zero() -> None:
    validator_key, validator = new_peer()
    sybil_keys = [new_peer() for _ in range(5)]
    # sybils sign lavish receipts for one another; none of them earned anything from a trusted signer
    receipts = _open(
        *(
            make.training(key, sybil_keys[(i + 1) % 5][1], tokens=10**6)
            for i, (key, _) in enumerate(sybil_keys)
        )
    )
    _, honest = new_peer()
    receipts += _open(make.verdict(validator_key, honest, tokens=30))
    report = compute_credit(receipts, trusted=[validator], now=NOW)
    for _, sybil in sybil_keys:
        credit = report.contributors[sybil]
        assert credit.total == 0 and credit.recent == 0 and credit.untrusted == 10**6
    assert report.contributors[honest].total == 30
    assert report.standing_counts()["untrusted"] == 5
    assert report.leaderboard()[0].contributor == honest


def test_one_hop_vouching_is_capped_by_what_the_voucher_earned() -> None:
    validator_key, validator = new_peer()
    worker_key, worker = new_peer()
    friend_key, friend = new_peer()
    _, friend_of_friend = new_peer()
    receipts = _open(
        make.verdict(validator_key, worker, tokens=100, issued_at=NOW - 50),
        # the worker (credited by a trusted validator) vouches for a friend: 60 + 60 > its 100
        make.transfer(worker_key, friend, byte_count=int(0.6 * (1 << 20)), issued_at=NOW - 40),
        make.transfer(worker_key, friend, byte_count=int(0.6 * (1 << 20)), issued_at=NOW - 30),
        make.transfer(worker_key, friend, byte_count=1 << 20, issued_at=NOW - 20),
    )
    receipts += _open(make.seed(worker_key, friend))
    # two hops: the friend earned only vouched credit, so what it signs is untrusted
    receipts += _open(make.training(friend_key, friend_of_friend, tokens=10**6))
    report = compute_credit(receipts, trusted=[validator], now=NOW)
    assert report.vouchers == {worker: 100}
    standings = [report.standing[r.receipt_id] for r in receipts]
    assert standings == [
        Standing.TRUSTED,
        Standing.VOUCHED,
        Standing.VOUCHED,
        Standing.CAPPED,
        Standing.CAPPED,
        Standing.UNTRUSTED,
    ]
    vouched = sum(report.counted.get(r.receipt_id, 0.0) for r in receipts[1:])
    assert vouched == pytest.approx(100)
    assert report.contributors[friend].total == pytest.approx(100)
    assert report.contributors[friend_of_friend].total == 0


def test_no_trusted_signer_means_no_credit() -> None:
    key, _ = new_peer()
    _, peer = new_peer()
    receipts = _open(make.training(key, peer, tokens=10))
    report = compute_credit(receipts, trusted=[], now=NOW)
    assert report.contributors[peer].total == 0 and report.contributors[peer].untrusted == 10
    assert report.counted == {} and receipt_id(receipts[0].envelope) in report.standing


def test_colluding_workers_cannot_mint_verdict_or_training_credit_for_a_sybil() -> None:
    validator_key, validator = new_peer()
    trainer_key, trainer = new_peer()
    alice_key, alice = new_peer()
    bob_key, bob = new_peer()
    _, sybil = new_peer()
    signers = RunSigners(validators=frozenset({validator, trainer}), trainers=frozenset({trainer}))
    honest = _open(
        make.verdict(validator_key, alice, tokens=500, issued_at=NOW - 60),
        make.verdict(trainer_key, bob, tokens=500, issued_at=NOW - 60),  # a trainer validates too
    )
    # both workers hold (inference) credit from the run's signers; each signs "accepted" verdicts
    # and training receipts for the other and for an identity that did no work
    collusion = _open(
        *(make.verdict(key, peer, tokens=400) for key in (alice_key, bob_key) for peer in (sybil,)),
        make.verdict(alice_key, bob, tokens=400),
        make.verdict(bob_key, alice, tokens=400),
        make.training(alice_key, sybil, tokens=400),
        make.training(bob_key, alice, tokens=400),
        # a validator is not a trainer: its training receipt is not evidence of training
        make.training(validator_key, sybil, tokens=400),
    )
    report = compute_credit(honest + collusion, trusted=signers, now=NOW)
    assert report.contributors[sybil].total == 0
    assert report.contributors[alice].total == pytest.approx(500)
    assert report.contributors[bob].total == pytest.approx(500)
    assert all(report.standing[r.receipt_id] is Standing.UNTRUSTED for r in collusion)
    assert all(report.standing[r.receipt_id] is Standing.TRUSTED for r in honest)


def test_a_credited_worker_still_vouches_for_transfers_and_seed_service() -> None:
    validator_key, validator = new_peer()
    worker_key, worker = new_peer()
    _, relay = new_peer()
    receipts = _open(
        make.verdict(validator_key, worker, tokens=100, issued_at=NOW - 10),
        make.transfer(worker_key, relay, byte_count=int(0.5 * (1 << 20))),
    )
    report = compute_credit(receipts, trusted=RunSigners(validators=frozenset({validator})), now=NOW)
    assert report.standing[receipts[1].receipt_id] is Standing.VOUCHED
    assert report.contributors[relay].total == pytest.approx(50)


def test_a_flat_trusted_set_trusts_every_kind() -> None:
    key, signer = new_peer()
    _, peer = new_peer()
    receipts = _open(make.verdict(key, peer, tokens=5), make.training(key, peer, tokens=7))
    assert RunSigners.of([signer]) == RunSigners.for_every_kind([signer])
    assert compute_credit(receipts, trusted=[signer], now=NOW).contributors[peer].total == 12


def test_rejections_count_against_a_worker_only_from_the_runs_validators() -> None:
    validator_key, validator = new_peer()
    sybil_key, _ = new_peer()
    _, worker = new_peer()
    receipts = _open(
        make.verdict(validator_key, worker, tokens=0, accepted=False, reason="abandoned"),
        make.verdict(validator_key, worker, tokens=9, accepted=False, reason="stale"),
        # anyone can sign a verdict: a stranger's word that the worker abandoned work is not on record
        *(make.verdict(sybil_key, worker, tokens=0, accepted=False, reason="abandoned") for _ in range(5)),
    )
    report = compute_credit(receipts, trusted=RunSigners(validators=frozenset({validator})), now=NOW)
    assert report.contributors[worker].rejected == {"abandoned": 1, "stale": 1}


def test_validation_receipts_count_only_from_the_runs_trainers_and_once_per_group() -> None:
    trainer_key, trainer = new_peer()
    other_trainer_key, other_trainer = new_peer()
    validator_key, validator = new_peer()
    worker_key, worker = new_peer()
    _, standalone = new_peer()
    signers = RunSigners(
        validators=frozenset({validator, trainer, other_trainer}),
        trainers=frozenset({trainer, other_trainer}),
    )
    group = b"g" * 32
    counted = _open(make.validation(trainer_key, standalone, tokens=600, group_hash=group))
    # the same group taken again by the same or another trainer (a retried forward): the same claim
    again = _open(
        make.validation(trainer_key, standalone, tokens=600, group_hash=group),
        make.validation(other_trainer_key, standalone, tokens=600, group_hash=group),
    )
    # a validator or a credited worker is no trainer: its validation receipts are worth nothing
    worthless = _open(
        make.verdict(validator_key, worker, tokens=100, issued_at=NOW - 60),
        make.validation(validator_key, standalone, tokens=600),
        make.validation(worker_key, standalone, tokens=600),
    )
    report = compute_credit(counted + again + worthless, trusted=signers, now=NOW)
    credit = report.contributors[standalone]
    assert credit.roles["validator"].total == pytest.approx(600 * CreditRates().per_token_validated) == 150
    assert credit.total == 150 and credit.roles["validator"].receipts == 5
    assert credit.untrusted == pytest.approx(2 * 150)
    assert report.standing[counted[0].receipt_id] is Standing.TRUSTED
    assert all(report.standing[r.receipt_id] is Standing.DUPLICATE for r in again)
    assert all(report.standing[r.receipt_id] is Standing.UNTRUSTED for r in worthless[1:])
    assert report.counts_for(ReceiptKind.VALIDATION, trainer)
    assert not report.counts_for(ReceiptKind.VALIDATION, validator)
    assert not report.counts_for(ReceiptKind.VALIDATION, worker)  # holds credit, vouches for nothing here
