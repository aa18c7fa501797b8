"""Signed averager declarations in the DHT: matchmaking and state-sharing, as hivemind's, but signed.

hivemind's averagers declare themselves with plain values under their PeerID, which the record
validator refuses (anyone could write them for anyone; see `protocol.averager_declaration`).
Here the same declarations are signed envelopes under `hn:<PeerID>`:

* `SignedGroupKeyManager` replaces hivemind's `GroupKeyManager` inside the averager's
  matchmaking (`install_signed_matchmaking`): who is looking for a group under a matchmaking
  key, and who left it.
* `Declarer` signs and stores any declaration, `read_declarations` verifies a lookup's: the
  state-sharing mixin (`node.averaging.state_sync`) uses them for `.all_averagers`, where each
  averager says whether it serves its state and at which priority (its outer step).

A reader keeps only values whose envelope verifies for that key and whose signer is the PeerID
it names, so the peers it contacts and the steps it sees were each declared by that peer itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import hivemind.averaging.averager as hivemind_averager
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.averaging.key_manager import GroupKey, GroupKeyManager, is_valid_group
from hivemind.averaging.matchmaking import Matchmaking
from hivemind.p2p import PeerID
from hivemind.utils import DHTExpiration

from node.signed_records import verified_values
from protocol.averager_declaration import (
    AVERAGER_DECLARATION_DOMAIN,
    MAX_AVERAGER_DECLARATION_TTL_S,
    declaration_payload,
    parse_declaration,
)
from protocol.dht_keys import signed_subkey
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.peer_keys import peer_id_from_private_key

__all__ = [
    "Declaration",
    "Declarer",
    "SignedGroupKeyManager",
    "install_signed_matchmaking",
    "read_declarations",
]

logger = logging.getLogger(__name__)

_RUN_ID = ""
"""Declarations are bound to their run by the DHT key (the run's averaging prefix) they are signed for."""


@dataclass(frozen=True)
class Declaration:
    """One verified declaration: who declared, until when, and what."""

    peer: bytes
    expires_at: float
    looking_for_group: bool
    shares_state: bool
    state_priority: float


class Declarer:
    """Signs and stores this averager's declarations (lives in the averager's process)."""

    def __init__(self, dht: Any, private_key: Ed25519PrivateKey) -> None:
        self.dht = dht
        self.private_key = private_key
        self.peer_id = PeerID(peer_id_from_private_key(private_key))
        if self.peer_id != dht.peer_id:
            raise ValueError("the signing key is not the key of the DHT's PeerID")
        self._seq = time.time_ns()

    async def declare(self, key: str, expiration_time: float, payload: bytes) -> bool:
        """Sign `payload` for `key`, valid until `expiration_time`, and store it; True if stored."""
        self._seq = max(self._seq + 1, time.time_ns())
        value = seal(
            self.private_key,
            domain=AVERAGER_DECLARATION_DOMAIN,
            run_id=_RUN_ID,
            dht_key=key,
            expires_at=expiration_time,
            seq=self._seq,
            payload=payload,
        )
        subkey = signed_subkey(self.peer_id.to_base58())
        return bool(await self.dht.store(key, value, expiration_time, subkey=subkey, return_future=True))


def read_declarations(found: Any, key: str, now: float | None = None) -> list[Declaration]:
    """The verified, unexpired declarations in a DHT lookup result under `key` (the rest is skipped)."""
    declarations = []
    for value in verified_values(
        found,
        key=key,
        domain=AVERAGER_DECLARATION_DOMAIN,
        run_id=_RUN_ID,
        max_ttl_s=MAX_AVERAGER_DECLARATION_TTL_S,
        now=now,
    ):
        try:
            message = parse_declaration(value.payload)
        except InvalidMessage as exc:
            logger.info("ignoring an averager declaration under %s: %s", key, exc)
            continue
        declarations.append(
            Declaration(
                peer=value.signer,
                expires_at=value.expires_at,
                looking_for_group=message.looking_for_group,
                shares_state=message.shares_state,
                state_priority=message.state_priority,
            )
        )
    return declarations


class SignedGroupKeyManager(GroupKeyManager):
    """hivemind's matchmaking keys, with every declaration signed by the averager that makes it."""

    def __init__(
        self, base: GroupKeyManager, declarer: Declarer, admitted: frozenset[bytes] | None = None
    ) -> None:
        """`admitted`: the PeerIDs of the only trainers whose declarations count (None: anyone's)."""
        super().__init__(base.dht, base.prefix, base.group_bits, base.target_group_size)
        self.declarer = declarer
        self.admitted = admitted

    async def declare_averager(
        self, group_key: GroupKey, peer_id: PeerID, expiration_time: float, looking_for_group: bool = True
    ) -> bool:
        if peer_id != self.declarer.peer_id:
            raise ValueError("an averager declares itself only")
        # as hivemind does: leaving re-declares just after the same expiry, so it replaces the entry
        if not looking_for_group:
            expiration_time = float(np.nextafter(expiration_time, float("inf")))
        payload = declaration_payload(looking_for_group=looking_for_group)
        return await self.declarer.declare(group_key, expiration_time, payload)

    async def get_averagers(
        self, group_key: GroupKey, only_active: bool
    ) -> list[tuple[PeerID, DHTExpiration]]:
        if not is_valid_group(group_key):
            raise ValueError(f"group key {group_key!r} is not a matchmaking key")
        found = await self.dht.get(group_key, latest=True, return_future=True)
        return [
            (PeerID(d.peer), d.expires_at)
            for d in read_declarations(found, group_key)
            if (d.looking_for_group or not only_active) and (self.admitted is None or d.peer in self.admitted)
        ]


def install_signed_matchmaking(
    private_key: Ed25519PrivateKey, admitted: frozenset[bytes] | None = None
) -> None:
    """Make every matchmaking hivemind builds in this process declare itself signed with `private_key`
    (and, with `admitted`, look for groups among those trainers only).

    Call in the averager's own process before hivemind starts it: hivemind builds its
    `Matchmaking` there, by name, from its averager module, and the process serves this one
    averager only.
    """

    class SignedMatchmaking(Matchmaking):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            base: GroupKeyManager = self.group_key_manager  # type: ignore[has-type]
            self.group_key_manager = SignedGroupKeyManager(base, Declarer(base.dht, private_key), admitted)

    hivemind_averager.Matchmaking = SignedMatchmaking  # type: ignore[misc]
