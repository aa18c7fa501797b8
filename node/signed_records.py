"""Signed DHT records: the one place that stores this node's signed values and reads others'.

Every project record lives under a DHT key with one subkey per signer (`hn:<PeerID>`); the
value is an envelope (`protocol.envelope`) signed by that PeerID for that key, domain, run and
expiry. Reading re-verifies each envelope even though the DHT's record validator already did:
a local cache or a validator change must never let a forged record through.

Sequence numbers come from one scheme for every domain: nanoseconds since the epoch, bumped
past the last one used, so they increase across restarts of the same identity too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import PeerID

from node.identity import Identity
from node.log_limit import LogOncePer
from protocol.dht_keys import SIGNED_SUBKEY_PREFIX, signed_subkey
from protocol.envelope import open_envelope, seal
from protocol.errors import InvalidMessage

logger = logging.getLogger(__name__)
_IGNORED_LOG = LogOncePer(60.0, max_keys=256)


@dataclass(frozen=True)
class SignedValue:
    """One verified value under a key: who signed it, what it says, and its envelope's metadata."""

    signer: bytes
    payload: bytes
    seq: int
    expires_at: float


class SignedRecords:
    """Stores values signed by `identity` and reads verified values under any key, on a hivemind DHT.

    The methods are coroutines: call them on the node's event loop (`node.runtime`).
    """

    def __init__(self, dht: Any, identity: Identity) -> None:
        self.dht = dht
        self.identity = identity
        self._seq = time.time_ns()

    def next_seq(self) -> int:
        self._seq = max(self._seq + 1, time.time_ns())
        return self._seq

    async def store(self, key: str, *, domain: str, run_id: str, payload: bytes, ttl_s: float) -> bool:
        """Sign `payload` for `key` and store it under our subkey; True if a DHT peer accepted it."""
        expires_at = time.time() + ttl_s
        value = seal(
            self.identity.private_key,
            domain=domain,
            run_id=run_id,
            dht_key=key,
            expires_at=expires_at,
            seq=self.next_seq(),
            payload=payload,
        )
        subkey = signed_subkey(self.identity.peer_id.to_base58())
        return bool(await self.dht.store(key, value, expires_at, subkey=subkey, return_future=True))

    async def get(
        self, key: str, *, domain: str, run_id: str, max_ttl_s: float, now: float | None = None
    ) -> list[SignedValue]:
        """Every value under `key` that verifies for `domain` and `run_id`; invalid ones are skipped."""
        found = await self.dht.get(key, latest=True, return_future=True)
        return verified_values(found, key=key, domain=domain, run_id=run_id, max_ttl_s=max_ttl_s, now=now)


def verified_values(
    found: Any, *, key: str, domain: str, run_id: str, max_ttl_s: float, now: float | None = None
) -> list[SignedValue]:
    """The signed, unexpired values of a hivemind DHT lookup result (a dictionary of subkeys)."""
    if found is None or not isinstance(found.value, dict):
        return []
    now = time.time() if now is None else now
    values = []
    ignored, latest = 0, ""
    for subkey, item in found.value.items():
        if not (isinstance(subkey, str) and subkey.startswith(SIGNED_SUBKEY_PREFIX)):
            continue
        try:
            signer = PeerID.from_base58(subkey[len(SIGNED_SUBKEY_PREFIX) :]).to_bytes()
            envelope = open_envelope(
                item.value,
                domain=domain,
                run_id=run_id,
                dht_key=key,
                signer=signer,
                max_ttl_s=max_ttl_s,
                now=now,
            )
        except (InvalidMessage, ValueError) as exc:
            ignored, latest = ignored + 1, f"{subkey}: {exc}"
            continue
        if envelope.expires_at < now:
            continue
        values.append(SignedValue(envelope.signer, envelope.payload, envelope.seq, envelope.expires_at))
    if ignored and _IGNORED_LOG(key):  # a key may hold any number of strangers' records: one line per key
        logger.info(
            "ignoring %d invalid record(s) under %s (said once per %.0f s per key); latest %s",
            ignored,
            key,
            _IGNORED_LOG.interval_s,
            latest,
        )
    return values
