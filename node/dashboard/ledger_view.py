"""Reading a ledger that keeps growing, from many threads: the current snapshot, and a fresh reader.

`LedgerView` is what the dashboard's panels read from. It keeps one `LedgerSnapshot`, recomputed
when the ledger has grown or the snapshot is older than `max_age_s` (recent averages decay with
time): on new receipts every caller waits for the snapshot that has them, so no panel stays
behind the others, while an aged snapshot keeps being served as one thread computes the next.

The node filling the ledger is usually another process, and an open `Ledger` maps only the
peers it has loaded, so reads go through a reader reopened whenever the ledger has grown. The
ledger is re-counted at most every `count_ttl_s` (SQLite counts a table by scanning it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from node.dashboard.snapshot import LedgerSnapshot, take_snapshot
from node.ledger import DEFAULT_HALF_LIFE_S, Ledger

T = TypeVar("T")


class LedgerView:
    """A growing ledger seen through a cached snapshot and an up-to-date reader; see the module docstring."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        trusted: Iterable[bytes],
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        max_age_s: float = 30.0,
        count_ttl_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.trusted = frozenset(trusted)
        self.half_life_s = half_life_s
        self.max_age_s = max_age_s
        self.count_ttl_s = count_ttl_s
        self.clock = clock
        self._reader = ledger
        self._reader_count = -1
        """Receipts stored when `_reader` was opened (-1: `ledger` itself, whose peers may be stale)."""
        self._counted = 0
        self._counted_at = -float("inf")
        self._snapshot: LedgerSnapshot | None = None
        self._snapshot_lock = threading.Lock()

    def count(self, *, fresh: bool = False) -> int:
        """Receipts in the ledger, as counted at most `count_ttl_s` ago (`fresh`: now)."""
        now = time.monotonic()
        if fresh or now - self._counted_at >= self.count_ttl_s:
            self._counted, self._counted_at = len(self.ledger), now
        return self._counted

    def snapshot(self, *, fresh: bool = False) -> LedgerSnapshot:
        """The current snapshot, recomputed if the ledger grew or it is older than `max_age_s`
        (`fresh`: the ledger is counted now, not at most `count_ttl_s` ago)."""
        current = self._snapshot
        count = self.count(fresh=fresh)
        if (
            current is not None
            and current.count == count
            and self.clock() - current.report.now < self.max_age_s
        ):
            return current
        if not self._snapshot_lock.acquire(blocking=current is None or current.count != count):
            return current  # type: ignore[return-value]  # aged only: served while another thread computes
        try:
            current = self._snapshot
            if (
                current is None
                or current.count < count
                or self.clock() - current.report.now >= self.max_age_s
            ):
                count = self.count(fresh=True)
                now = self.clock()
                current = self._snapshot = self.read(
                    lambda ledger: take_snapshot(
                        ledger.receipts(with_envelopes=True),
                        count=count,
                        trusted=self.trusted,
                        now=now,
                        half_life_s=self.half_life_s,
                    )
                )
            return current
        finally:
            self._snapshot_lock.release()

    def read(self, read: Callable[[Ledger], T]) -> T:
        """`read(ledger)` on a reader that knows every peer stored so far (reopened once more if a
        receipt of a peer it does not know arrived while reading)."""
        for attempt in range(2):
            count = self.count()
            if (attempt or count != self._reader_count) and str(self.ledger.path) != ":memory:":
                self._reader = Ledger(self.ledger.path)  # the previous reader closes once no thread uses it
                self._reader_count = count
            try:
                return read(self._reader)
            except KeyError:
                if attempt:
                    raise
        raise AssertionError("unreachable")
