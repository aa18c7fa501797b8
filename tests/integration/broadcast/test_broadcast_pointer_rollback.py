"""An older signed pointer re-stored under a run's `latest` key must not roll the newest version back
(issue 12, 'Low'): neither for a node that has seen the newer one, nor for a new joiner."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from node.broadcast.config import BroadcastConfig
from node.broadcast.records import BroadcastRecords
from node.dht_node import start_loopback_dht
from node.identity import Identity, create_identity
from node.signed_records import SignedValue
from protocol.dht_keys import signed_subkey, weights_pointer_key, weights_version_key
from protocol.envelope import seal
from protocol.limits import MAX_WEIGHTS_POINTER_TTL_S, MIN_CHUNK_BYTES
from protocol.manifest import WEIGHTS_POINTER_DOMAIN, Manifest, build_manifest
from tests.helpers.broadcast import (
    Swarm,
    SwarmNode,
    assert_state_dicts_equal,
    make_state_dict,
    open_swarm,
    start_broadcast,
    store_in_caches,
)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"), num_nodes=3)


def test_a_replayed_older_pointer_does_not_roll_latest_back(swarm: Swarm, tmp_path: Path) -> None:
    initial_peers = [str(a) for a in swarm.nodes[0].dht.get_visible_maddrs()]
    # the publisher and the attacker run client-mode DHT nodes (they store and look up but answer no
    # lookups): hivemind caches what a node stores, and the publisher's cache would still show v2
    identity = create_identity(tmp_path / "publisher.key")
    publisher = SwarmNode(identity, start_loopback_dht(initial_peers, client_mode=True, identity=identity))
    swarm.nodes.append(publisher)
    attacker_dht = start_loopback_dht(initial_peers, client_mode=True)

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        joiner = None
        try:
            key = weights_pointer_key("rollback")
            subkey = signed_subkey(publisher.identity.peer_id.to_base58())
            v1 = await pub.publish("rollback", 1, make_state_dict(seed=51, total_floats=20_000))
            captured = (await attacker_dht.get(key, latest=True, return_future=True)).value[subkey]
            state = make_state_dict(seed=52, total_floats=20_000)
            await pub.publish("rollback", 2, state)

            # The attacker re-stores the captured v1 pointer (with a short DHT expiry) in every node's
            # cache, beside a validly signed pointer of its own with a later expiry: hivemind answers
            # lookups from a cache whose expiry is later than its storage's, which hides the v2 pointer.
            own = create_identity(tmp_path / "attacker.key")
            expires_at = time.time() + MAX_WEIGHTS_POINTER_TTL_S - 60
            decoy = seal(
                own.private_key,
                domain=WEIGHTS_POINTER_DOMAIN,
                run_id="rollback",
                dht_key=key,
                expires_at=expires_at,
                seq=1,
                payload=dataclasses.replace(v1.pointer(), publisher=own.peer_id_bytes).to_payload(),
            )
            records = [
                (subkey, captured.value, min(captured.expiration_time, time.time() + 30)),
                (signed_subkey(own.peer_id.to_base58()), decoy, expires_at),
            ]
            targets = [node.identity.peer_id for node in swarm.nodes if node is not publisher]
            await asyncio.wrap_future(
                attacker_dht.run_coroutine(
                    partial(store_in_caches, key=key, records=records, targets=targets), return_future=True
                )
            )
            found = await attacker_dht.get(key, latest=True, return_future=True)
            replayed = found.value[subkey].value
            assert replayed == captured.value  # a plain lookup of `latest` now names v1

            # a new joiner (a DHT node that joins now: nothing stored yet) finds v2, the version after
            # the one `latest` names, and fetches it
            joiner = await start_broadcast(swarm.add(), tmp_path / "joiner", [publisher])
            entry = await asyncio.wait_for(joiner.fetch("rollback", manifest_timeout_s=10.0), timeout=60)
            assert entry.version == 2
            assert_state_dicts_equal(await joiner.load("rollback", 2), state)
            newest = await joiner.records.find_pointer("rollback")
            assert newest is not None and newest.version == 2
        finally:
            for b in (pub, joiner):
                if b is not None:
                    await b.stop()
            attacker_dht.shutdown()

    asyncio.run(main())


class _FakeSigned:
    """Stands in for `SignedRecords`: what a lookup of each key returns (already verified values)."""

    def __init__(self, identity: Identity, values: dict[str, list[SignedValue]]) -> None:
        self.identity = identity
        self.values = values

    async def get(self, key: str, **_: object) -> list[SignedValue]:
        return self.values.get(key, [])


def _manifest(identity: Identity, version: int) -> Manifest:
    return build_manifest(
        identity.private_key,
        run_id="floor",
        version=version,
        total_bytes=100,
        chunk_bytes=MIN_CHUNK_BYTES,
        chunk_hashes=bytes(32),
        tensors=(),
        created_at=0.0,
    )


def test_the_newest_never_goes_below_a_version_held_or_seen(tmp_path: Path) -> None:
    """Even when every key that names the newer version is hidden and `latest` names an older one."""
    publisher = create_identity(tmp_path / "publisher.key")
    v1, v2 = _manifest(publisher, 1), _manifest(publisher, 2)
    old = SignedValue(publisher.peer_id_bytes, v1.pointer().to_payload(), seq=1, expires_at=time.time() + 60)
    signed = _FakeSigned(publisher, {weights_pointer_key("floor"): [old]})
    held: list[object] = []
    records = BroadcastRecords(
        signed=signed,  # type: ignore[arg-type]
        p2p=None,  # type: ignore[arg-type]
        config=BroadcastConfig(store_dir=tmp_path, authorized_publishers=[publisher.peer_id.to_base58()]),
        authorized={publisher.peer_id_bytes},
        held=lambda: held,  # type: ignore[arg-type,return-value]
    )

    async def main() -> None:
        assert (await records.find_pointer("floor")) == v1.pointer()
        held.append(SimpleNamespace(run_id="floor", manifest=v2))  # this node fetched v2 meanwhile
        assert (await records.find_pointer("floor")) == v2.pointer()
        held.clear()  # v2 pruned from the store: it was seen, so the newest still does not go back
        assert (await records.find_pointer("floor")) == v2.pointer()
        # a pointer found under a version's own key counts as seen too
        signed.values[weights_version_key("floor", 3)] = [
            SignedValue(
                publisher.peer_id_bytes, _manifest(publisher, 3).pointer().to_payload(), 1, time.time() + 60
            )
        ]
        assert (await records.find_pointer("floor", 3)) is not None
        signed.values.pop(weights_version_key("floor", 3))
        newest = await records.find_pointer("floor")
        assert newest is not None and newest.version == 3

    asyncio.run(main())


def test_a_foreign_pointer_seen_on_every_poll_is_logged_once_per_signer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone can store a pointer under the run's key; a follower polls it twice a second and must not
    log a line each time."""
    import logging

    publisher = create_identity(tmp_path / "publisher.key")
    strangers = [create_identity(tmp_path / f"stranger{i}.key") for i in range(2)]
    foreign = [
        SignedValue(
            s.peer_id_bytes, _manifest(s, 9).pointer().to_payload(), seq=1, expires_at=time.time() + 60
        )
        for s in strangers
    ]
    records = BroadcastRecords(
        signed=_FakeSigned(publisher, {weights_pointer_key("floor"): foreign}),  # type: ignore[arg-type]
        p2p=None,  # type: ignore[arg-type]
        config=BroadcastConfig(store_dir=tmp_path, authorized_publishers=[publisher.peer_id.to_base58()]),
        authorized={publisher.peer_id_bytes},
        held=lambda: [],
    )

    async def poll() -> None:
        for _ in range(20):
            assert await records.find_pointer("floor") is None

    with caplog.at_level(logging.INFO, logger="node.broadcast.records"):
        asyncio.run(poll())
    lines = [r.getMessage() for r in caplog.records if "unauthorised" in r.getMessage()]
    assert len(lines) == 2 and {line.split("unauthorised ")[1].split()[0] for line in lines} == {
        s.peer_id.to_base58() for s in strangers
    }
