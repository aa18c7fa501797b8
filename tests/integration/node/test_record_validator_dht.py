"""The DHT record validator on a real pair of DHT nodes: a forged record is never returned by get."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import hivemind
import pytest
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from node.identity import create_identity
from node.swarm import wait_until
from protocol.dht_keys import node_records_key, signed_subkey
from protocol.envelope import seal
from protocol.node_record import NODE_RECORD_DOMAIN
from protocol.record_validator import SignedRecordValidator
from tests.helpers.forged_records import A_ID, ALICE, FORGERIES, KEY, forgery, node_record, valid_record


@pytest.fixture(scope="module")
def honest_and_attacker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[hivemind.DHT, hivemind.DHT]]:
    tmp: Path = tmp_path_factory.mktemp("dht")
    honest = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        record_validators=[SignedRecordValidator()],
        identity_path=str(create_identity(tmp / "honest.key").path),
        check_if_identity_free=False,
    )
    # the attacker runs no validator, so it will happily store and serve forged records
    attacker = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=honest.get_visible_maddrs(),
        identity_path=str(create_identity(tmp / "attacker.key").path),
        check_if_identity_free=False,
    )
    yield honest, attacker
    attacker.shutdown()
    honest.shutdown()


def test_forged_records_are_never_stored_or_returned(
    honest_and_attacker: tuple[hivemind.DHT, hivemind.DHT],
) -> None:
    honest, attacker = honest_and_attacker
    forgeries = []
    for kind in FORGERIES:
        record = forgery(kind)
        subkey = MSGPackSerializer.loads(record.subkey)
        forgeries.append(subkey)
        attacker.store(
            KEY, MSGPackSerializer.loads(record.value), expiration_time=record.expiration_time, subkey=subkey
        )
    # the forgeries really are in the network: the attacker (no validator) serves them
    served = attacker.get(KEY, latest=True)
    assert served is not None and set(forgeries) <= set(served.value)
    good = valid_record()
    good_subkey = MSGPackSerializer.loads(good.subkey)
    assert attacker.store(
        KEY, MSGPackSerializer.loads(good.value), expiration_time=good.expiration_time, subkey=good_subkey
    )

    def honest_sees_valid() -> bool:
        found = honest.get(KEY, latest=True)
        return found is not None and good_subkey in found.value

    assert wait_until(honest_sees_valid, timeout_s=20)
    found = honest.get(KEY, latest=True)
    assert found is not None
    assert set(found.value) == {good_subkey}, "a forged record was stored or returned"


def test_an_unsigned_plain_value_cannot_squat_a_key(
    honest_and_attacker: tuple[hivemind.DHT, hivemind.DHT],
) -> None:
    """A regular value with a far expiry would replace the key's dictionary of signed records."""
    honest, attacker = honest_and_attacker
    key = node_records_key("squatted-run")
    expires = time.time() + 60
    signed = seal(
        ALICE,
        domain=NODE_RECORD_DOMAIN,
        run_id="squatted-run",
        dht_key=key,
        expires_at=expires,
        seq=1,
        payload=node_record(A_ID, run_id="squatted-run").to_payload(),
    )
    subkey = signed_subkey(PeerID(A_ID).to_base58())
    attacker.store(key, b"squatted", expiration_time=time.time() + 31 * 365 * 86400)
    honest.store(key, signed, expiration_time=expires, subkey=subkey)

    def honest_sees_the_record() -> bool:
        found = honest.get(key, latest=True)
        return found is not None and isinstance(found.value, dict) and subkey in found.value

    assert wait_until(honest_sees_the_record, timeout_s=20)
