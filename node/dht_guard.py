"""A DHT protocol that checks every store request before hivemind touches it, and bans senders of bad ones.

hivemind's `DHTProtocol.rpc_store` trusts the shape of a request: misaligned lists or a
dictionary tag over a non-dictionary hit `assert`s, an undecodable key or subkey raises, and
nothing limits how many records one request carries; the sender is never penalised.
`GuardedDHTProtocol.rpc_store` first checks the whole request (aligned lists, 20-byte keys, values
and subkeys within the record caps, tags that decode, a dictionary tag only over a dictionary); a
malformed request stores nothing and its sender is banned for a growing period, during which all
its DHT requests are answered empty. A well-formed request is taken apart record by record (a
whole dictionary, which hivemind relays to cache a lookup's result, into its items): each record
is checked by the record validator, then by the node's storage quota (`node.dht_quota`: per key,
per owner and in all, the records with least standing making way), and only then handed to
hivemind's own handler, alone. Records refused for the quota are not a fault of the sender (an
honest node relays what it found), so they cost it nothing; they are logged once a minute.

`install(trusted_owners)` swaps the protocol class in the process that runs the DHT (hivemind's DHT
child process; see `node.dht_node`); it must run before the DHT node is created there.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import hivemind.dht.node
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer

from node.bans import BanList
from node.dht_quota import QuotaLimits, Slot, StoreQuota
from node.log_limit import LogOncePer
from protocol.dht_keys import SIGNED_SUBKEY_PREFIX
from protocol.limits import MAX_ENVELOPE_BYTES
from protocol.record_validator import SignedRecordValidator

logger = logging.getLogger(__name__)

MAX_STORE_SUBKEY_BYTES = 128
MAX_STORE_VALUE_BYTES = MAX_ENVELOPE_BYTES + 64
BAN_BASE_S = 60.0
BAN_MAX_S = 3600.0
SWEEP_EVERY_S = 2.0
"""How often the quota forgets records that expired."""
REFUSAL_LOG_EVERY_S = 60.0


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
    """hivemind's DHT protocol behind a request check, a ban list and a storage quota (see the module
    docstring)."""

    trusted_owners: ClassVar[frozenset[bytes]] = frozenset()
    """PeerIDs whose records outrank everyone's in the quota (set by `install`)."""
    quota_limits: ClassVar[QuotaLimits] = QuotaLimits()
    bans: BanList
    quota: StoreQuota
    _checker: SignedRecordValidator
    _swept_at: float
    _refusals: int
    _refusal_log: LogOncePer

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        # hivemind names RPC handlers after the class: keep DHTProtocol's names so every node interoperates
        return DHTProtocol._get_handle_name(namespace, method_name)

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> GuardedDHTProtocol:
        self = await super().create(*args, **kwargs)
        self.bans = BanList(BAN_BASE_S, BAN_MAX_S, owner="dht")
        self.quota = StoreQuota(cls.quota_limits, trusted=cls.trusted_owners)
        self._checker = SignedRecordValidator()
        self._swept_at = time.monotonic()
        self._refusals = 0
        self._refusal_log = LogOncePer(REFUSAL_LOG_EVERY_S, max_keys=1)
        return self  # type: ignore[return-value]

    async def rpc_store(self, request: dht_pb2.StoreRequest, context: P2PContext) -> dht_pb2.StoreResponse:
        if self.bans.is_banned(context.remote_id):
            return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys))
        problem = store_request_problem(request)
        if problem is not None:
            self.bans.ban(context.remote_id, f"dht store: {problem}")
            return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys))
        self._sweep()
        response = dht_pb2.StoreResponse(store_ok=[], peer=self.node_info)
        peer = request.peer if request.HasField("peer") else None
        for key, tag, value, expiration, in_cache in zip(
            request.keys,
            request.subkeys,
            request.values,
            request.expiration_time,
            request.in_cache,
            strict=True,
        ):
            if tag == self.IS_DICTIONARY:
                items = [
                    (self.serializer.dumps(subkey), item.value, item.expiration_time)
                    for subkey, item in self.serializer.loads(value).items()
                ]
            else:
                items = [(tag, value, expiration)]
            stored = [
                await self._store_one(key, item, in_cache, context, peer if index == 0 else None)
                for index, item in enumerate(items)
            ]
            response.store_ok.append(bool(stored) and all(stored))
            peer = None
        return response

    async def _store_one(
        self,
        key: bytes,
        item: tuple[bytes, bytes, float],
        in_cache: bool,
        context: P2PContext,
        peer: dht_pb2.NodeInfo | None,
    ) -> bool:
        """Store one record if it is valid and the quota makes room for it; True if hivemind stored it."""
        tag, value, expiration = item
        owner = _owner_of(tag)
        if owner is None or not self._checker.validate(DHTRecord(key, tag, value, expiration)):
            return False
        slot = Slot(in_cache, key, MSGPackSerializer.loads(tag))
        admission = self.quota.admit(slot, owner, len(value))
        if not admission.admitted:
            self._refused(admission.reason)
            return False
        single = dht_pb2.StoreRequest(
            keys=[key], subkeys=[tag], values=[value], expiration_time=[expiration], in_cache=[in_cache]
        )
        if peer is not None:
            single.peer.CopyFrom(peer)
        answer = await super().rpc_store(single, context)
        if not answer.store_ok or not answer.store_ok[0]:
            return False
        for victim in admission.victims:
            self._evict(victim)
        self.quota.stored(slot, owner, len(value), expiration)
        return True

    def _evict(self, slot: Slot) -> None:
        storage = self.cache if slot.in_cache else self.storage
        key_id = DHTID.from_bytes(slot.key)
        found = storage.get(key_id)
        if found is not None and isinstance(found.value, DictionaryDHTValue) and slot.subkey in found.value:
            del found.value[slot.subkey]
            if not found.value:
                del storage[key_id]
        self.quota.evicted(slot)

    def _held(self, slot: Slot) -> bool:
        found = (self.cache if slot.in_cache else self.storage).get(DHTID.from_bytes(slot.key))
        return (
            found is not None and isinstance(found.value, DictionaryDHTValue) and slot.subkey in found.value
        )

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= SWEEP_EVERY_S:
            self._swept_at = now
            self.quota.sweep(self._held)

    def _refused(self, reason: str) -> None:
        self._refusals += 1
        if self._refusal_log("refused"):
            logger.info(
                "DHT storage quota: refused %d record(s) in the last %.0f s (latest: %s); %d stored for others",
                self._refusals,
                REFUSAL_LOG_EVERY_S,
                reason,
                len(self.quota),
            )
            self._refusals = 0

    async def rpc_find(self, request: dht_pb2.FindRequest, context: P2PContext) -> dht_pb2.FindResponse:
        if self.bans.is_banned(context.remote_id):
            return dht_pb2.FindResponse(results=[])
        if any(len(key) != DHTID.HASH_NBYTES for key in request.keys):
            self.bans.ban(context.remote_id, "dht find: malformed request")
            return dht_pb2.FindResponse(results=[])
        return await super().rpc_find(request, context)


def _owner_of(tag: bytes) -> bytes | None:
    """The PeerID (bytes) a record's `hn:<PeerID>` subkey names, or None for anything else."""
    try:
        subkey = MSGPackSerializer.loads(tag)
        if isinstance(subkey, str) and subkey.startswith(SIGNED_SUBKEY_PREFIX):
            return PeerID.from_base58(subkey[len(SIGNED_SUBKEY_PREFIX) :]).to_bytes()
    except Exception:  # whatever a stranger's bytes decode to: not a record we keep
        return None
    return None


def install(trusted_owners: frozenset[bytes] = frozenset(), limits: QuotaLimits | None = None) -> None:
    """Make hivemind build `GuardedDHTProtocol` for every DHT node created in this process, whose quota
    ranks the records of `trusted_owners` first (within `limits`, else the defaults)."""
    GuardedDHTProtocol.trusted_owners = trusted_owners
    GuardedDHTProtocol.quota_limits = limits or QuotaLimits()
    hivemind.dht.node.DHTProtocol = GuardedDHTProtocol  # type: ignore[misc]
