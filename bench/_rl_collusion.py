"""The credit collusion attack of `bench/rl.py`: credited workers signing credit for a sybil.

Two workers each hold accepted verdicts from the run's validator (real signed receipts, in a real
SQLite ledger). Each then signs "accepted" verdicts and training receipts for the other and for
a fresh identity that did no work, and the ledger computes credit with the run's signers by role.
`sybil_credit` is the inference and trainer credit the sybil ends with (target 0) and
`collusion_gain` what the two workers gained from each other's receipts (target 0). Transfer and
seed receipts are left out: a credited peer may still vouch for those, capped at its own credit,
by design (`node.ledger.credit`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from node.ledger import Ledger, RunSigners
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer

HONEST_TOKENS = 1000
COLLUDING_TOKENS = 4000


def run_collusion() -> dict[str, str]:
    now = time.time()
    validator_key, validator = new_peer()
    keys = {name: new_peer() for name in ("alice", "bob", "sybil")}
    peer = {name: peer_id for name, (_, peer_id) in keys.items()}
    key = {name: k for name, (k, _) in keys.items()}
    envelopes = [
        make.verdict(validator_key, peer[name], tokens=HONEST_TOKENS, issued_at=now - 60)
        for name in ("alice", "bob")
    ]
    for signer, others in (("alice", ("bob", "sybil")), ("bob", ("alice", "sybil"))):
        for other in others:
            envelopes.append(make.verdict(key[signer], peer[other], tokens=COLLUDING_TOKENS))
            envelopes.append(make.training(key[signer], peer[other], tokens=COLLUDING_TOKENS))
    with tempfile.TemporaryDirectory() as scratch, Ledger(Path(scratch) / "ledger.db", RUN) as ledger:
        added = ledger.add_many(envelopes)
        if added.added != len(envelopes):
            raise RuntimeError(f"the ledger refused receipts: {added.refused}")
        report = ledger.credit(trusted=RunSigners(validators=frozenset({validator})), now=now)
    sybil = report.contributors.get(peer["sybil"])
    sybil_credit = 0.0 if sybil is None else sybil.roles["inference"].total + sybil.roles["trainer"].total
    gain = sum(report.contributors[peer[name]].total - HONEST_TOKENS for name in ("alice", "bob"))
    print(f"collusion: sybil credit {sybil_credit:.0f}, colluders' gain {gain:.0f} "
          f"(each colluder signed {2 * COLLUDING_TOKENS} tokens of verdicts and training for each other identity)")  # fmt: skip
    return {"sybil_credit": f"{sybil_credit:.0f}", "collusion_gain": f"{gain:.0f}"}
