"""Fuzzing receipts: any bytes are refused with InvalidMessage, and the only receipt that opens is the signed one.

The canonical-encoding check means no mutation of a valid receipt opens (a mutation that opened
would be a second receipt id for the same signed work).
"""

from __future__ import annotations

import time

from hypothesis import strategies as st

from protocol.errors import InvalidMessage
from protocol.receipts import open_receipt
from tests.helpers import receipts as make
from tests.helpers.fuzzing import arbitrary_or_mutated, fuzz_variants
from tests.helpers.receipts import new_peer

NOW = time.time()
KEY, SIGNER = new_peer()
_, WORKER = new_peer()
SEEDS = [
    make.verdict(KEY, WORKER, issued_at=NOW),
    make.training(KEY, WORKER, issued_at=NOW),
    make.transfer(KEY, WORKER, issued_at=NOW),
    make.seed(KEY, WORKER, issued_at=NOW),
]


def _receipt_property(data: bytes) -> None:
    try:
        receipt = open_receipt(data, now=NOW)
    except InvalidMessage:
        return
    assert data in SEEDS and receipt.signer == SIGNER and receipt.contributor == WORKER


test_receipt_fast, test_receipt_slow = fuzz_variants(
    _receipt_property, st.one_of(*(arbitrary_or_mutated(seed) for seed in SEEDS))
)
