"""A flood of strangers' records is one log line, not one per record (issue 30, item 7)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from node.signed_records import verified_values
from protocol.dht_keys import signed_subkey
from protocol.record_validator import SignedRecordValidator
from tests.helpers.forged_records import KEY, RUN, forgery


def _found(count: int) -> SimpleNamespace:
    """A lookup result holding `count` records that do not verify (garbage under valid subkeys)."""
    junk = SimpleNamespace(value=b"junk", expiration_time=time.time() + 60)
    return SimpleNamespace(value={signed_subkey(f"not-a-peer-{n}"): junk for n in range(count)})


def test_a_lookup_full_of_invalid_records_logs_one_line_per_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="node.signed_records")
    key = f"{KEY}-flood-logging"
    for _ in range(3):
        assert verified_values(_found(50), key=key, domain="node", run_id=RUN, max_ttl_s=300.0) == []
    lines = [r for r in caplog.records if r.name == "node.signed_records"]
    assert len(lines) == 1 and "50 invalid record(s)" in lines[0].getMessage()


def test_the_record_validator_logs_a_flood_of_forgeries_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="protocol.record_validator")
    validator = SignedRecordValidator()
    assert not any(validator.validate(forgery("forged signature")) for _ in range(40))
    assert len([r for r in caplog.records if r.name == "protocol.record_validator"]) <= 1
