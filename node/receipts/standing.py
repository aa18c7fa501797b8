"""Which pulled receipts a node keeps: every receipt of a signer with standing, few of anyone else's.

Signing a receipt is free, so peers could serve floods of genuine receipts signed by identities
they mint: they count zero in credit, but they would fill the disk. A signer has standing in a
run when the run names it (`ReceiptsConfig.trusted_signers`: its trainers and validators), when
it is this node, or when it holds credit from a named signer (it is the contributor of an
accepted receipt one of them signed: a worker, a volunteer trainer, a peer that served weights).
A pulled receipt of any other signer is kept only within a budget per source peer
(`max_unvouched_per_source`) and in all (`max_unvouched`); the ledger notes it as unvouched, and
past the total the oldest unvouched receipts are evicted first, as they are when the ledger
reaches its size cap, so a flood can neither exhaust the disk nor stop the pulls that bring the
receipts that count. Signers are read from the envelopes before they are verified; one that
claims a standing it was not signed by is refused by the ledger right after, and its server
banned. The vouched-for contributors are re-read from the ledger once per pull cycle (`refresh`).
"""

from __future__ import annotations

from collections.abc import Iterable

from node.ledger import Ledger
from node.receipts.quota import claimed_signer
from protocol.receipts import MAX_RECEIPT_BYTES, receipt_id

__all__ = ["StandingFilter"]


class StandingFilter:
    """The budgets of pulled receipts whose signers have no standing in the run."""

    def __init__(
        self,
        trusted: Iterable[bytes],
        *,
        own: bytes,
        per_source: int,
        total: int,
    ) -> None:
        if per_source < 0 or total < 0:
            raise ValueError("the unvouched budgets cannot be negative")
        self.trusted = frozenset(trusted) | {own}
        self.per_source = per_source
        self.total = total
        self._vouched: frozenset[bytes] = frozenset()
        self.dropped = 0
        """Receipts of signers without standing left out, since the start."""
        self.evicted = 0
        """Unvouched receipts evicted to make room, since the start."""

    def refresh(self, ledger: Ledger) -> None:
        """Re-read who holds credit from the run's named signers (blocking: call it off the loop)."""
        self._vouched = frozenset(ledger.credited_by(self.trusted))

    def has_standing(self, signer: bytes) -> bool:
        return signer in self.trusted or signer in self._vouched

    def admit(self, ledger: Ledger, source: bytes, receipts: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """The receipts of a page to store, and of those, the ids of the unvouched ones; the surplus
        over `source`'s budget is dropped (counted in `dropped`)."""
        room = max(0, self.per_source - ledger.unvouched_count(source))
        kept: list[bytes] = []
        unvouched: list[bytes] = []
        for data in receipts:
            signer = claimed_signer(data)
            if signer is None or self.has_standing(signer):
                kept.append(data)  # an unreadable one goes on to be refused (and its server banned)
            elif room > 0:
                room -= 1
                kept.append(data)
                if isinstance(data, bytes) and len(data) <= MAX_RECEIPT_BYTES:
                    unvouched.append(receipt_id(data))
            else:
                self.dropped += 1
        return kept, unvouched

    def stored(self, ledger: Ledger, source: bytes, unvouched: list[bytes]) -> None:
        """Note the unvouched receipts of a page that were stored, then keep at most `total` of them."""
        if not unvouched:
            return
        ledger.mark_unvouched(ledger.stored(unvouched), source)
        if ledger.unvouched_count() > self.total:
            self.evicted += ledger.evict_unvouched(self.total)

    def make_room(self, ledger: Ledger, cap: int) -> bool:
        """At the ledger's size cap, evict unvouched receipts (all of them if need be) to bring it back
        under; whether there is room now."""
        if len(ledger) < cap:
            return True
        self.evicted += ledger.evict_unvouched(max(0, ledger.unvouched_count() - (len(ledger) - cap + 1)))
        return len(ledger) < cap
