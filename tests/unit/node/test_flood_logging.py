"""A flood of strangers' records, or a dead peer polled every second, is one log line, not one per record or poll."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from hivemind.p2p import PeerID

from node.bans import BanList
from node.broadcast.errors import WeightsUnavailable
from node.broadcast.manifest_fetch import obtain_manifest
from node.signed_records import verified_values
from protocol.dht_keys import signed_subkey
from protocol.manifest import WeightsPointer
from protocol.peer_keys import peer_id_from_private_key
from protocol.record_validator import SignedRecordValidator
from tests.helpers.forged_records import KEY, RUN, forgery
from tests.helpers.rollouts import key


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


def test_a_peer_that_keeps_failing_to_serve_a_manifest_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker polls a dead publisher every second while it waits: one INFO line, not one per poll."""
    publisher = peer_id_from_private_key(key("dead-publisher"))
    pointer = WeightsPointer(RUN, 3, b"c" * 32, 100, 1, 10, publisher)

    async def no_holders() -> list:  # type: ignore[type-arg]
        return []

    async def unreachable(_holder: object) -> None:
        raise ConnectionError("failed to dial\n  * [/ip4/127.0.0.1/tcp/40579] dial backoff")

    async def poll() -> None:
        with pytest.raises(WeightsUnavailable):
            await obtain_manifest(
                None,  # type: ignore[arg-type]  # never reached: the dial fails first
                pointer,
                find_holders=no_holders,
                dial=unreachable,
                max_holders=4,
                own_peer_id=PeerID(b"\x00\x24" + b"\x01" * 36),
                bans=BanList(1.0, 2.0),
                authorized={publisher},
                request_timeout_s=1.0,
                deadline_s=0.0,
                owner="polling-worker",
            )

    caplog.set_level(logging.DEBUG, logger="node.broadcast.manifest_fetch")
    for _ in range(5):
        asyncio.run(poll())
    failures = [r for r in caplog.records if "manifest from" in r.getMessage()]
    assert len(failures) == 5 and [r.levelno for r in failures].count(logging.INFO) == 1
