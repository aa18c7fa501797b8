"""The swarm table's policy and throughput columns (`node.dashboard.work_view`): only receipts the
run's signers may sign count, one piece of work counts once, and only the last ten minutes' tokens."""

from __future__ import annotations

import time

import pytest

from node.dashboard.work_view import THROUGHPUT_WINDOW_S, WorkTally
from node.ledger import RunSigners
from protocol.receipts import open_receipt
from tests.helpers.dashboard_training import rewarded_verdict, training_round
from tests.helpers.receipts import RUN, new_peer, transfer, validation

NOW = time.time()


def _tally(signers: RunSigners, envelopes: list[bytes]) -> WorkTally:
    tally = WorkTally(signers, NOW)
    for envelope in envelopes:
        tally.add(open_receipt(envelope, run_id=RUN))
    return tally


def test_the_policy_version_is_the_newest_a_validator_accepted() -> None:
    (val, val_id), (sybil, _), (trainer, trainer_id), (_, worker) = (new_peer() for _ in range(4))
    signers = RunSigners(validators=frozenset({val_id}), trainers=frozenset({trainer_id}))
    work = _tally(
        signers,
        [
            rewarded_verdict(val, worker, version=2, reward=0.5),
            rewarded_verdict(val, worker, version=4, reward=0.5),
            rewarded_verdict(val, worker, version=9, reward=0.0, accepted=False),  # rejected
            rewarded_verdict(sybil, worker, version=12, reward=1.0),  # not the run's validator
            rewarded_verdict(trainer, worker, version=11, reward=1.0),  # a trainer, not a validator here
        ],
    ).finish()
    assert work[worker].policy_version == 4


def test_throughput_counts_verified_tokens_of_the_window_once() -> None:
    keys = {name: new_peer() for name in ("a", "b", "c", "val", "outsider")}
    key = {name: k for name, (k, _) in keys.items()}
    peer = {name: p for name, (_, p) in keys.items()}
    signers = RunSigners(
        validators=frozenset({peer["val"]}), trainers=frozenset({peer["a"], peer["b"], peer["c"]})
    )
    old = NOW - THROUGHPUT_WINDOW_S - 60.0
    work = _tally(
        signers,
        [
            # every member signs for every other: each contributor's 1000 tokens are attested twice
            *training_round({peer[n]: (key[n], 3.0) for n in ("a", "b", "c")}, step=1, tokens=1000),
            *training_round({peer[n]: (key[n], 3.0) for n in ("a", "b")}, step=0, tokens=5000, issued_at=old),
            rewarded_verdict(key["val"], peer["outsider"], version=1, reward=0.5, tokens=300),
            rewarded_verdict(key["val"], peer["outsider"], version=1, reward=0.0, tokens=900, accepted=False),
            rewarded_verdict(key["outsider"], peer["a"], version=1, reward=1.0, tokens=4000),  # untrusted
            transfer(key["val"], peer["a"], byte_count=1 << 20),  # not work measured in tokens
        ],
    ).finish()
    minutes = THROUGHPUT_WINDOW_S / 60.0
    assert work[peer["a"]].tokens_per_min == pytest.approx(1000 / minutes)
    assert work[peer["c"]].tokens_per_min == pytest.approx(1000 / minutes)
    assert work[peer["outsider"]].tokens_per_min == pytest.approx(300 / minutes)
    assert work[peer["a"]].policy_version is None
    assert peer["val"] not in work


def test_a_standalone_validators_throughput_is_the_tokens_trainers_took_from_it() -> None:
    """Its column read 0 in a run where it validated thousands of tokens a minute."""
    (trainer, trainer_id), (sybil, _), (_, validator) = (new_peer() for _ in range(3))
    signers = RunSigners(validators=frozenset({validator, trainer_id}), trainers=frozenset({trainer_id}))
    work = _tally(
        signers,
        [
            validation(trainer, validator, tokens=600),
            validation(sybil, validator, tokens=9000),  # not the run's trainer
        ],
    ).finish()
    assert work[validator].tokens_per_min == pytest.approx(600 / (THROUGHPUT_WINDOW_S / 60.0))
    assert work[validator].policy_version is None
