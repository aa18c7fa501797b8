"""What the RL validator tests share: the run's constants, the validator's and workers' keys, a
settable clock, a validator that issues each group's ticket as it arrives, tampering edits used
by several tests, and readers of sealed verdicts."""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import rollouts_pb2
from protocol.envelope import open_envelope
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollout_messages import DOMAIN_VERDICT as VERDICT_DOMAIN
from tests.helpers.rl_workers import Generated
from verification.validator import Validator, VerifiedRollout
from verification.verdict import RejectReason

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


def peer_key(seed: int) -> tuple[Ed25519PrivateKey, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    return key, peer_id_from_private_key(key)


VALIDATOR_KEY, VALIDATOR_ID = peer_key(1)
_, ALICE = peer_key(2)
_, BOB = peer_key(3)


class AutoTicketValidator(Validator):
    """A `Validator` that issues each submitted group's ticket (its counter, at the version the group
    names) just before judging it, as if the worker had asked for it then: for the tests of every
    check after the ticket's. A counter issued once is never issued again, so replays stay replays.
    Ticket checks themselves are tested on `Validator` (`test_tickets.py`)."""

    def judge_groups(
        self, submissions: Sequence[tuple[bytes, rollouts_pb2.RolloutGroup]]
    ) -> list[tuple[list[bytes], list[VerifiedRollout]]]:
        with self._lock:  # the book is the validator's, used under its lock (groups may come from threads)
            for worker, group in submissions:
                while not self.tickets.was_issued(worker, int(group.counter)):
                    held = len(self.tickets.open_tickets(worker))
                    if not self.tickets.issue(worker, held + 1, int(group.policy_version), NOW)[held:]:
                        break  # every ticket the book keeps open is taken: the group goes in without one
        return super().judge_groups(submissions)


def open_verdicts(sealed: list[bytes]) -> list[rollouts_pb2.RolloutVerdict]:
    out = []
    for data in sealed:
        env = open_envelope(data, domain=VERDICT_DOMAIN, run_id=RUN, signer=VALIDATOR_ID, now=NOW)
        out.append(rollouts_pb2.RolloutVerdict.FromString(env.payload))
    return out


def reasons(sealed: list[bytes]) -> list[str]:
    return [v.reason for v in open_verdicts(sealed)]


def assert_group_rejected(validator: Validator, sealed: list[bytes], accepted: list, reason: str) -> None:
    assert accepted == []
    verdicts = open_verdicts(sealed)
    assert [v.reason for v in verdicts] == [reason] * len(verdicts)
    assert all(not v.accepted and v.reward == 0.0 and v.detail for v in verdicts)
    assert all(v.banned_until == 0.0 for v in verdicts)  # no ban, so no verdict announces one


def other_seed(index: int, gen: Generated) -> None:
    if index == 2:
        gen.seed += 1


def drop_a_proof(index: int, gen: Generated) -> None:
    if index == 0:
        gen.proofs = gen.proofs[:-1]
