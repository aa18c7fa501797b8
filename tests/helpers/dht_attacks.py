"""Raw DHT requests an attacker sends with a plain hivemind node (run inside its DHT process via
`dht.run_coroutine`, so they live in an importable module)."""

from __future__ import annotations

import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.routing import DHTID
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from protocol.averager_declaration import AVERAGER_DECLARATION_DOMAIN, declaration_payload
from protocol.dht_keys import signed_subkey
from protocol.envelope import seal
from protocol.peer_keys import peer_id_from_private_key


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
    """Store one valid signed averager declaration (by a fresh key, under its subkey) at `target`."""
    signer = Ed25519PrivateKey.generate()
    expires = time.time() + 30
    envelope = seal(
        signer,
        domain=AVERAGER_DECLARATION_DOMAIN,
        run_id="",
        dht_key=key,
        expires_at=expires,
        seq=1,
        payload=declaration_payload(looking_for_group=True),
    )
    result = await node.protocol.call_store(
        target,
        [DHTID.generate(source=key)],
        [MSGPackSerializer.dumps(envelope)],
        [expires],
        subkeys=[signed_subkey(PeerID(peer_id_from_private_key(signer)).to_base58())],
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
