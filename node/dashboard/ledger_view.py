"""Reading a ledger that keeps growing, from many threads: the current snapshot, and a fresh reader.

`LedgerView` is what the dashboard's panels read from. It keeps one `LedgerSnapshot`, recomputed
when the ledger has grown or the snapshot is older than `max_age()` (recent averages decay with
time). Every panel reads the same snapshot, so no panel is ahead of another. On new receipts a
small ledger's callers wait for the snapshot that has them (it takes well under a second); a
ledger whose last snapshot took longer than `WAIT_FOR_SNAPSHOT_MAX_S` keeps serving the snapshot
it has while a background thread computes the next one, as an aged snapshot always is: at a
million receipts a snapshot takes tens of seconds, and a live swarm adds receipts every second,
so waiting would make every page load wait that long. Such a snapshot is recomputed at most once
every `AGED_REFRESH_COST_FACTOR` times its computing time, so that pages keep most of the CPU.

The node filling the ledger is usually another process, and an open `Ledger` maps only the
peers it has loaded, so reads go through a reader reopened whenever the ledger has grown. The
ledger is re-counted at most every `count_ttl_s` (SQLite counts a table by scanning it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from node.dashboard.snapshot import LedgerSnapshot, take_snapshot
from node.ledger import DEFAULT_HALF_LIFE_S, Ledger, RunSigners

T = TypeVar("T")
logger = logging.getLogger(__name__)

AGED_REFRESH_COST_FACTOR = 4.0
"""An aged snapshot is recomputed after at least this many times its last computing time."""

WAIT_FOR_SNAPSHOT_MAX_S = 1.0
"""Callers wait for the snapshot that has new receipts only if the last one took less than this."""


class LedgerView:
    """A growing ledger seen through a cached snapshot and an up-to-date reader; see the module docstring."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        trusted: Iterable[bytes] | RunSigners,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        max_age_s: float = 30.0,
        count_ttl_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.trusted = RunSigners.of(trusted)
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
        self._compute_s = 0.0
        """How long the last snapshot took to compute."""

    def count(self, *, fresh: bool = False) -> int:
        """Receipts in the ledger, as counted at most `count_ttl_s` ago (`fresh`: now)."""
        now = time.monotonic()
        if fresh or now - self._counted_at >= self.count_ttl_s:
            self._counted, self._counted_at = len(self.ledger), now
        return self._counted

    def latest(self) -> LedgerSnapshot | None:
        """The last snapshot computed, however old (None before the first), never waiting and never
        counting the ledger: a snapshot that is missing or older than `max_age` is recomputed in
        the background, for the next call (a client that reads only the swarm panel sees the
        ledger's figures too)."""
        current = self._snapshot
        if current is None or self.clock() - current.report.now >= self.max_age():
            self._refresh_in_background()
        return current

    def snapshot(self, *, fresh: bool = False) -> LedgerSnapshot:
        """The current snapshot: recomputed at once if the ledger grew (in the background if that
        takes long), in the background if it aged (`fresh`: the ledger is counted now, not at most
        `count_ttl_s` ago)."""
        current = self._snapshot
        count = self.count(fresh=fresh)
        if current is not None and current.count >= count:
            if self.clock() - current.report.now >= self.max_age():
                self._refresh_in_background()
            return current
        if current is not None and self._compute_s > WAIT_FOR_SNAPSHOT_MAX_S:
            if self.clock() - current.report.now >= AGED_REFRESH_COST_FACTOR * self._compute_s:
                self._refresh_in_background()
            return current
        with self._snapshot_lock:  # the ledger grew: every caller waits for the snapshot that has it
            current = self._snapshot
            if current is None or current.count < count:
                current = self._compute()
            return current

    def max_age(self) -> float:
        """How old a snapshot may grow before it is recomputed: `max_age_s`, or more for a ledger so
        large that computing it takes over 1/`AGED_REFRESH_COST_FACTOR` of that (at a million
        receipts a snapshot takes seconds of CPU, which the page's requests need too)."""
        return max(self.max_age_s, AGED_REFRESH_COST_FACTOR * self._compute_s)

    def _refresh_in_background(self) -> None:
        if not self._snapshot_lock.acquire(blocking=False):
            return  # being recomputed already

        def refresh() -> None:
            try:
                self._compute()
            except Exception as exc:  # e.g. the ledger closed as the dashboard stopped
                logger.warning("could not refresh the ledger snapshot: %s", exc)
            finally:
                self._snapshot_lock.release()

        threading.Thread(target=refresh, name="ledger-snapshot", daemon=True).start()

    def _compute(self) -> LedgerSnapshot:
        count = self.count(fresh=True)
        now = self.clock()
        started = time.monotonic()
        snapshot = self.read(
            lambda ledger: take_snapshot(
                ledger.receipts(with_envelopes=True),
                count=count,
                trusted=self.trusted,
                now=now,
                half_life_s=self.half_life_s,
            )
        )
        self._compute_s = time.monotonic() - started
        self._snapshot = snapshot
        return snapshot

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
