"""A DHT protocol that checks every store request before hivemind touches it, and bans senders of bad ones.

hivemind's `DHTProtocol.rpc_store` trusts the shape of a request: misaligned lists or a
dictionary tag over a non-dictionary hit `assert`s, an undecodable key or subkey raises, and
nothing limits how many records one request carries; the sender is never penalised.
`GuardedDHTProtocol.rpc_store` first checks the whole request (aligned lists, 20-byte keys, values and subkeys within the record caps, tags
that decode, a dictionary tag only over a dictionary); a malformed request stores nothing and its sender is banned for a growing
period, during which all its DHT requests are answered empty. Well-formed requests go on to
hivemind's own handler, where the record validator judges each record.

`install()` swaps the protocol class in the process that runs the DHT (hivemind's DHT child
process; see `node.dht_node`); it must run before the DHT node is created there.
"""

from __future__ import annotations

import logging
from typing import Any

import hivemind.dht.node
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import P2PContext
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from node.bans import BanList
from protocol.limits import MAX_ENVELOPE_BYTES

logger = logging.getLogger(__name__)

MAX_STORE_SUBKEY_BYTES = 128
MAX_STORE_VALUE_BYTES = MAX_ENVELOPE_BYTES + 64
MAX_STORE_DICTIONARY_BYTES = 256 * MAX_STORE_VALUE_BYTES
"""A whole dictionary (hivemind re-stores found dictionaries on nearby nodes as a cache)."""
BAN_BASE_S = 60.0
BAN_MAX_S = 3600.0


def store_request_problem(request: dht_pb2.StoreRequest) -> str | None:
    """Why `request` is malformed, or None if its shape is sound (its records are judged later)."""
    count = len(request.keys)
    if (
        not count
        == len(request.subkeys)
        == len(request.values)
        == len(request.expiration_time)
        == len(request.in_cache)
    ):
        return "misaligned store request"
    for key, tag, value in zip(request.keys, request.subkeys, request.values, strict=True):
        if len(key) != DHTID.HASH_NBYTES:
            return f"key of {len(key)} bytes"
        if len(tag) > MAX_STORE_SUBKEY_BYTES:
            return "oversized subkey"
        if tag == DHTProtocol.IS_DICTIONARY:  # hivemind caches whole dictionaries on nearby nodes
            if len(value) > MAX_STORE_DICTIONARY_BYTES:
                return "oversized dictionary"
            try:
                decoded = MSGPackSerializer.loads(value)
            except Exception:
                return "undecodable dictionary"
            if not isinstance(decoded, DictionaryDHTValue):
                return "dictionary tag over a value that is not a dictionary"
            continue
        if len(value) > MAX_STORE_VALUE_BYTES:
            return "oversized value"
        try:
            MSGPackSerializer.loads(tag)
        except Exception:
            return "undecodable subkey"
    return None


class GuardedDHTProtocol(DHTProtocol):
    """hivemind's DHT protocol behind a request check and a ban list (see the module docstring)."""

    bans: BanList

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        # hivemind names RPC handlers after the class: keep DHTProtocol's names so every node interoperates
        return DHTProtocol._get_handle_name(namespace, method_name)

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> GuardedDHTProtocol:
        self = await super().create(*args, **kwargs)
        self.bans = BanList(BAN_BASE_S, BAN_MAX_S, owner="dht")
        return self  # type: ignore[return-value]

    async def rpc_store(self, request: dht_pb2.StoreRequest, context: P2PContext) -> dht_pb2.StoreResponse:
        if self.bans.is_banned(context.remote_id):
            return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys))
        problem = store_request_problem(request)
        if problem is not None:
            self.bans.ban(context.remote_id, f"dht store: {problem}")
            return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys))
        return await super().rpc_store(request, context)

    async def rpc_find(self, request: dht_pb2.FindRequest, context: P2PContext) -> dht_pb2.FindResponse:
        if self.bans.is_banned(context.remote_id):
            return dht_pb2.FindResponse(results=[])
        if any(len(key) != DHTID.HASH_NBYTES for key in request.keys):
            self.bans.ban(context.remote_id, "dht find: malformed request")
            return dht_pb2.FindResponse(results=[])
        return await super().rpc_find(request, context)


def install() -> None:
    """Make hivemind build `GuardedDHTProtocol` for every DHT node created in this process."""
    hivemind.dht.node.DHTProtocol = GuardedDHTProtocol  # type: ignore[misc]
