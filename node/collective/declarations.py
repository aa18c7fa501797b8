"""A trainer's round declaration on the DHT: its own, stored and renewed while it lives, and everyone else's, read and verified.

A declaration (`protocol.averaging_round.RoundDeclaration`) says which outer step a trainer holds
and averages for next. It is a signed record under `dht_keys.averaging_round_key`, one subkey per
signer, expiring after `ttl_s` (so a killed trainer drops out within seconds) and renewed three
times per lifetime. Reading verifies each record's signature and payload and skips our own, the
trainers a closed run does not admit, and anything malformed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from node.collective.sealing import RUN_ID
from node.signed_records import SignedRecords
from protocol.averaging_round import (
    ROUND_DECLARATION_DOMAIN,
    ROUND_DECLARATION_TTL_S,
    RoundDeclaration,
    parse_round_declaration,
)
from protocol.errors import InvalidMessage

__all__ = ["DeclarationBoard"]

logger = logging.getLogger(__name__)


class DeclarationBoard:
    """Our declaration under `key` (renewed by `renew_forever`) and the other trainers' (see module docstring)."""

    def __init__(
        self, records: SignedRecords, key: str, *, ttl_s: float, admits: Callable[[bytes], bool], label: str
    ) -> None:
        self.records = records
        self.key = key
        self.ttl_s = ttl_s
        self.admits = admits
        self.label = label
        self.current: RoundDeclaration | None = None

    async def publish(self, declaration: RoundDeclaration) -> None:
        """Store `declaration` as ours from now on (a failed store is retried by the renewal)."""
        self.current = declaration
        await self._store(declaration)

    async def _store(self, declaration: RoundDeclaration) -> None:
        try:
            await self.records.store(
                self.key,
                domain=ROUND_DECLARATION_DOMAIN,
                run_id=RUN_ID,
                payload=declaration.payload(),
                ttl_s=self.ttl_s,
            )
        except Exception as exc:  # the renewal tries again
            logger.debug("%s: round declaration failed: %r", self.label, exc)

    async def renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            if self.current is not None:
                await self._store(self.current)

    async def read(self) -> dict[bytes, RoundDeclaration]:
        """Every live trainer's verified declaration (ours excluded; only admitted trainers in a closed run)."""
        me = self.records.identity.peer_id_bytes
        values = await self.records.get(
            self.key, domain=ROUND_DECLARATION_DOMAIN, run_id=RUN_ID, max_ttl_s=ROUND_DECLARATION_TTL_S
        )
        found: dict[bytes, RoundDeclaration] = {}
        for value in values:
            if value.signer == me or not self.admits(value.signer):
                continue
            try:
                found[value.signer] = parse_round_declaration(value.payload)
            except InvalidMessage:
                continue
        return found
