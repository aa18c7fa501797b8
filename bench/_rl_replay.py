"""The replay attack of `bench/rl.py`: one judged group submitted again, elsewhere and re-encoded.

A worker gets a ticket from validator A of a run and its honest group accepted there. It then
submits the same group, as it is and re-encoded (an unknown protobuf field appended to every
rollout: the same content, other bytes), to validator B of the run (with and without a ticket of
its own there) and to A again, and A again after a restart (its ticket book reopened from disk).
Every verdict goes into one ledger, credited with both validators trusted.
`replayed_groups_accepted` counts the acceptances beyond the first, `replayed_groups_credited`
the groups' worth of credit beyond the first (both target 0).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.ledger import Ledger, RunSigners
from protocol import rollouts_pb2
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import open_receipt
from tests.helpers.rl_workers import FakeTask, RLWorker
from training.model import ModelConfig, TinyGPT
from verification.tickets import TicketBook
from verification.validator import Validator

RUN = "bench-replay"
GROUP = 4


def _validator(key: Ed25519PrivateKey, book: TicketBook, policy: TinyGPT, task: FakeTask) -> Validator:
    validator = Validator(private_key=key, run_id=RUN, task=task, group_size=GROUP, tickets=book)
    validator.add_version(0, policy)
    return validator


def run_replay() -> dict[str, str]:
    task = FakeTask()
    policy = TinyGPT(ModelConfig()).eval()
    worker_key = Ed25519PrivateKey.generate()
    worker = peer_id_from_private_key(worker_key)
    keys = {name: Ed25519PrivateKey.generate() for name in ("a", "b")}
    maker = RLWorker(worker, run_id=RUN, task=task, group_size=GROUP)
    verdicts: list[bytes] = []
    with tempfile.TemporaryDirectory() as scratch:
        book_a = Path(scratch) / "a.tickets.db"
        a = _validator(keys["a"], TicketBook(book_a, run_id=RUN), policy, task)
        b = _validator(keys["b"], TicketBook(run_id=RUN), policy, task)
        [ticket] = a.issue_tickets(worker, 1, 0)
        group = maker.group(policy, 0, ticket.counter, nonce=ticket.nonce)
        re_encoded = rollouts_pb2.RolloutGroup()
        re_encoded.CopyFrom(group)
        for i, data in enumerate(group.rollouts):
            re_encoded.rollouts[i] = data + b"\xa8\x06\x01"  # field 101: unknown to the protocol
        verdicts += a.judge_group(worker, group)[0]
        attempts = [(b, group), (b, re_encoded), (a, group), (a, re_encoded)]
        for validator, submitted in attempts[:2]:
            verdicts += validator.judge_group(worker, submitted)[0]
        b.issue_tickets(worker, 1, 0)  # B issues the same counter, with a nonce of its own
        for validator, submitted in attempts:
            verdicts += validator.judge_group(worker, submitted)[0]
        a.tickets.close()
        restarted = _validator(keys["a"], TicketBook(book_a, run_id=RUN), policy, task)
        for submitted in (group, re_encoded):
            verdicts += restarted.judge_group(worker, submitted)[0]
        restarted.tickets.close()
        with Ledger(Path(scratch) / "ledger.db", RUN) as ledger:
            ledger.add_many(verdicts)
            signers = frozenset(peer_id_from_private_key(k) for k in keys.values())
            credit = ledger.credit(trusted=RunSigners(validators=signers), now=time.time())
    receipts = [open_receipt(v, run_id=RUN) for v in verdicts]
    accepted_groups = len({(r.signer, r.evidence) for r in receipts if r.accepted}) // GROUP
    credited = credit.contributors[worker].total
    first = sum(r.tokens for r in receipts[:GROUP])
    submissions = 1 + 2 + len(attempts) + 2
    print(f"replay: {submissions} submissions of one judged group, {accepted_groups} accepted, "
          f"credit {credited:.0f} (the first alone: {first})")  # fmt: skip
    return {
        "replayed_groups_accepted": str(accepted_groups - 1),
        "replayed_groups_credited": f"{(credited - first) / first:.0f}",
    }
