"""Bans on record: read from the trusted validators' signed verdicts, never from anyone else's."""

from __future__ import annotations

import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.dashboard.bans_view import BanTally
from protocol import rollouts_pb2
from protocol.receipts import open_receipt
from protocol.rollout_messages import seal_verdict
from tests.helpers.receipts import RUN, new_peer, verdict

NOW = time.time()


def banning_verdict(
    validator: Ed25519PrivateKey, worker: bytes, *, until: float, reason: str = "sampling"
) -> bytes:
    message = rollouts_pb2.RolloutVerdict(
        worker=worker,
        rollout_hash=os.urandom(32),
        policy_version=3,
        counter=7,
        tokens=40,
        accepted=False,
        reason=reason,
        detail="figures",
        issued_at=NOW,
        banned_until=until,
    )
    return seal_verdict(validator, run_id=RUN, verdict=message)


def tally(trusted: set[bytes], *envelopes: bytes) -> BanTally:
    bans = BanTally(frozenset(trusted))
    for data in envelopes:
        bans.note(open_receipt(data, run_id=RUN, now=NOW))
    return bans


def test_a_trusted_validators_banning_verdicts_are_listed_per_worker() -> None:
    validator, validator_id = new_peer()
    _, cheater = new_peer()
    _, honest = new_peer()
    bans = tally(
        {validator_id},
        banning_verdict(validator, cheater, until=NOW + 60, reason="sampling"),
        banning_verdict(validator, cheater, until=NOW + 120, reason="toploc_mantissa"),
        verdict(validator, cheater, accepted=False, reason="group_rejected", issued_at=NOW),
        verdict(validator, honest, accepted=False, reason="stale", issued_at=NOW),  # a rejection, no ban
        verdict(validator, honest, issued_at=NOW),
    )
    assert list(bans.workers) == [cheater]
    record = bans.workers[cheater]
    assert record.bans == 2 and record.banned_until == NOW + 120
    assert record.reasons == {"sampling": 1, "toploc_mantissa": 1}
    assert record.validators == {validator_id} and len(record.receipts) == 2


def test_a_ban_signed_by_a_validator_the_run_does_not_trust_is_not_listed() -> None:
    trusted, trusted_id = new_peer()
    sybil, _ = new_peer()
    _, victim = new_peer()
    _, cheater = new_peer()
    bans = tally(
        {trusted_id},
        banning_verdict(sybil, victim, until=NOW + 3600),
        banning_verdict(trusted, cheater, until=NOW + 60),
    )
    assert [w.worker for w in bans.ranked()] == [cheater]
