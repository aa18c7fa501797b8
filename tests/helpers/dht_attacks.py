"""Raw DHT requests an attacker sends with a plain hivemind node (run inside its DHT process via
`dht.run_coroutine`, so they live in an importable module)."""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from protocol.averaging_round import ROUND_DECLARATION_DOMAIN, RoundDeclaration
from protocol.dht_keys import node_records_key, signed_subkey, weights_pointer_key
from protocol.envelope import seal
from protocol.manifest import WEIGHTS_POINTER_DOMAIN, WeightsPointer
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.version import PROTOCOL_VERSION


async def send_raw_store(_dht: Any, node: Any, target: PeerID, request: bytes) -> str:
    """Send a serialized StoreRequest as is to `target`'s rpc_store; return what came back (or the error)."""
    try:
        response = await node.protocol.get_stub(target).rpc_store(
            dht_pb2.StoreRequest.FromString(request), timeout=10
        )
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return f"store_ok={list(response.store_ok)}"


async def store_declaration(_dht: Any, node: Any, target: PeerID, key: str) -> list[bool] | None:
    """Store one valid signed round declaration (by a fresh key, under its subkey) at `target`."""
    ((subkey, value, expires),) = sybil_round_declarations(
        key,
        range(1),
        seed=secrets.token_bytes(16),
        step=1,
        outer_hash="0123456789abcdef",
        codec="int8",
        ttl_s=30,
    )
    result = await node.protocol.call_store(
        target, [DHTID.generate(source=key)], [value], [expires], subkeys=[subkey]
    )
    return None if result is None else list(result)


def misaligned_store_request(key: str) -> bytes:
    key_bytes = DHTID.generate(source=key).to_bytes()
    return dht_pb2.StoreRequest(
        keys=[key_bytes, key_bytes],
        subkeys=[MSGPackSerializer.dumps(None)],
        values=[MSGPackSerializer.dumps(1.0)],
        expiration_time=[time.time() + 30],
        in_cache=[False],
    ).SerializeToString()


SYBIL_ADDRESSES = tuple(f"/dns4/{'.'.join(['a' * 55] * 4)}.example/tcp/{port}" for port in range(1000, 1016))
"""Sixteen long, valid addresses: they make a sybil's record over 4 KiB, as large as the flood that
once broke lookups (1,100 of them outgrow a p2pd message)."""


def sybil_node_records(run_id: str, count: int, ttl_s: float = 240.0) -> list[tuple[str, bytes, float]]:
    """`count` valid node records of `run_id`, each signed by a fresh key and padded to about 4 KiB with
    addresses: (subkey, value, expiry)."""
    key = node_records_key(run_id)
    expires = time.time() + ttl_s
    made = []
    for _ in range(count):
        signer = Ed25519PrivateKey.generate()
        peer = peer_id_from_private_key(signer)
        record = NodeRecord(
            peer_id=peer,
            roles=(Role.VALIDATOR,),
            public_name="sybil",
            run_id=run_id,
            software_version="0.1.0",
            protocol_version=PROTOCOL_VERSION,
            capabilities=Capabilities(cpu_count=2, memory_bytes=1 << 30),
            addresses=SYBIL_ADDRESSES,
            started_at=0.0,
            instance_id=secrets.token_bytes(16),
        )
        envelope = seal(
            signer,
            domain=NODE_RECORD_DOMAIN,
            run_id=run_id,
            dht_key=key,
            expires_at=expires,
            seq=1,
            payload=record.to_payload(),
        )
        made.append((signed_subkey(PeerID(peer).to_base58()), MSGPackSerializer.dumps(envelope), expires))
    return made


async def store_sybil_records(_dht: Any, node: Any, targets: list[PeerID], run_id: str, count: int) -> int:
    """Store `count` sybil node records of `run_id` (`sybil_node_records`, made here: hivemind's pipe to a
    DHT process breaks on requests over 64 KiB) at each of `targets`, a hundred per request; how many
    stores succeeded."""
    stored = 0
    for start in range(0, count, 100):
        batch = sybil_node_records(run_id, min(100, count - start))
        for target in targets:
            stored += await _store_batch(node, target, node_records_key(run_id), batch)
    return stored


async def flood_many_runs(_dht: Any, node: Any, target: PeerID, runs: int, per_run: int, prefix: str) -> int:
    """Store `per_run` sybil node records under the node-records key of each of `runs` runs at `target`
    (made a hundred at a time, here); how many stores succeeded."""
    stored = 0
    for run in range(runs):
        for start in range(0, per_run, 100):
            batch = sybil_node_records(f"{prefix}-{run}", min(100, per_run - start))
            stored += await _store_batch(node, target, node_records_key(f"{prefix}-{run}"), batch)
    return stored


async def _store_batch(node: Any, target: PeerID, key: str, batch: list[tuple[str, bytes, float]]) -> int:
    result = await node.protocol.call_store(
        target,
        [DHTID.generate(source=key)] * len(batch),
        [value for _, value, _ in batch],
        [expires for _, _, expires in batch],
        subkeys=[subkey for subkey, _, _ in batch],
    )
    return sum(bool(ok) for ok in result or [])


async def stored_under(_dht: Any, node: Any, key: str) -> int:
    """How many subkeys this DHT node holds under `key` (storage and cache), in its DHT process."""
    key_id = DHTID.generate(source=key)
    held = 0
    for local in (node.protocol.storage, node.protocol.cache):
        found = local.get(key_id)
        if found is not None and isinstance(found.value, DictionaryDHTValue):
            held += len(found.value)
    return held


async def bans_issued(_dht: Any, node: Any) -> dict[str, int]:
    """The bans this DHT node's guard issued, by reason (in its DHT process)."""
    return dict(node.protocol.bans.reasons)


async def standing_tier(_dht: Any, node: Any, owner: bytes) -> int:
    """The tier this DHT node's storage quota gives `owner` now (`node.dht_quota.Standing`)."""
    return int(node.protocol.quota.standing.rank(owner)[0])


def sybil_pointers(run_id: str, count: int, ttl_s: float = 600.0) -> list[tuple[str, bytes, float]]:
    """`count` valid weights pointers of `run_id` (`latest`), each signed by a fresh key naming itself
    the publisher of a version far ahead: (subkey, value, expiry)."""
    key = weights_pointer_key(run_id)
    expires = time.time() + ttl_s
    made = []
    for n in range(count):
        signer = Ed25519PrivateKey.generate()
        peer = peer_id_from_private_key(signer)
        pointer = WeightsPointer(
            run_id=run_id,
            version=1000 + n,
            content_id=secrets.token_bytes(32),
            manifest_bytes=4096,
            num_chunks=1,
            total_bytes=1024,
            publisher=peer,
        )
        envelope = seal(
            signer,
            domain=WEIGHTS_POINTER_DOMAIN,
            run_id=run_id,
            dht_key=key,
            expires_at=expires,
            seq=1,
            payload=pointer.to_payload(),
        )
        made.append((signed_subkey(PeerID(peer).to_base58()), MSGPackSerializer.dumps(envelope), expires))
    return made


async def store_sybil_pointers(_dht: Any, node: Any, targets: list[PeerID], run_id: str, count: int) -> int:
    """Store `count` sybil pointers (`sybil_pointers`, made here) under `run_id`'s `latest` at each of
    `targets`, a hundred per request; how many stores succeeded."""
    stored = 0
    for start in range(0, count, 100):
        batch = sybil_pointers(run_id, min(100, count - start))
        for target in targets:
            stored += await _store_batch(node, target, weights_pointer_key(run_id), batch)
    return stored


def sybil_round_declarations(
    key: str, signers: range, *, seed: bytes, step: int, outer_hash: str, codec: str, ttl_s: float = 240.0
) -> list[tuple[str, bytes, float]]:
    """Valid round declarations for `step` under `key` by the sybils numbered `signers` (identity i
    derived from `seed` and i, so the same sybils can declare again; no host stands behind any of
    them): (subkey, value, expiry)."""
    expires = time.time() + ttl_s
    payload = RoundDeclaration(step, outer_hash, codec, time.time(), True).payload()
    made = []
    for i in signers:
        signer = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed + i.to_bytes(4, "big")).digest())
        envelope = seal(
            signer,
            domain=ROUND_DECLARATION_DOMAIN,
            run_id="",
            dht_key=key,
            expires_at=expires,
            seq=step,
            payload=payload,
        )
        subkey = signed_subkey(PeerID(peer_id_from_private_key(signer)).to_base58())
        made.append((subkey, MSGPackSerializer.dumps(envelope), expires))
    return made


async def store_sybil_declarations(
    _dht: Any, node: Any, targets: list[PeerID], key: str, count: int, seed: bytes, **declared: Any
) -> int:
    """Store the round declarations of `count` sybils (`sybil_round_declarations` with `seed` and
    `declared`'s step, outer_hash and codec; a hundred per request) at each of `targets`; how many
    stores succeeded."""
    stored = 0
    for start in range(0, count, 100):
        batch = sybil_round_declarations(key, range(start, min(count, start + 100)), seed=seed, **declared)
        for target in targets:
            stored += await _store_batch(node, target, key, batch)
    return stored
