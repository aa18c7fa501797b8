"""The tickets a validator issued: every assignment it handed out is judged once or counted as abandoned.

A worker asks the validator it will submit to for tickets (`protocol.tickets`). Each ticket
fixes the assignment's counter (the worker's next one at this validator), its policy version
(named by the worker, one the validator holds and still judges) and a random nonce the prompt
and seeds derive from (`protocol.assignment`). The nonce is drawn after the version is chosen,
so a worker learns an assignment only once it is committed to it: it cannot generate one
counter under several versions and submit the best, nor generate a counter again. A ticket
stays open until a group for it is judged, or until its version has been too old to judge for
`grace_s`: then it was abandoned, and the worker's abandoned count grows (the validator signs an
`abandoned` verdict for it, so it is on record in every ledger). A worker holds at most
`max_open` open tickets here; asking again returns the same ones (a lost answer or a restart
costs nothing), so the only way to another assignment is to submit or abandon one.

The book lives in SQLite (a file beside the node's state, or memory): a validator that restarts
still knows every open ticket and every counter it issued, so a group judged before the restart
is a replay after it. It holds one row per open ticket and one per worker; the open tickets of
all workers together are capped (`max_open_total`), and so are the workers (`max_workers`: when
full, the workers that never had a group judged and hold no ticket are forgotten first), so fresh
identities cannot grow it without bound.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.local_db import open_database
from protocol.limits import MAX_OPEN_TICKETS, TICKET_NONCE_BYTES
from protocol.rollout_messages import ABANDONED

__all__ = ["ABANDONED", "DEFAULT_GRACE_S", "Ticket", "TicketBook", "TicketCounts", "ticket_evidence"]


DEFAULT_GRACE_S = 120.0
"""How long a ticket whose version became too old to judge stays open: a slow honest worker still
submits it (and gets it judged stale) rather than abandoning it."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    worker BLOB NOT NULL,
    counter INTEGER NOT NULL,
    version INTEGER NOT NULL,
    nonce BLOB NOT NULL,
    issued_at REAL NOT NULL,
    unusable_since REAL,
    PRIMARY KEY (worker, counter)
);
CREATE INDEX IF NOT EXISTS tickets_by_version ON tickets (version);
CREATE TABLE IF NOT EXISTS workers (
    worker BLOB PRIMARY KEY,
    next_counter INTEGER NOT NULL,
    judged INTEGER NOT NULL,
    abandoned INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Ticket:
    """One assignment issued to `worker`."""

    worker: bytes
    counter: int
    policy_version: int
    nonce: bytes


def ticket_evidence(validator: bytes, ticket: Ticket) -> bytes:
    """What an `abandoned` verdict names in place of a rollout hash: the ticket, at its validator."""
    return hashlib.sha256(
        b"hivenet-ticket\x00" + validator + b"\x00" + ticket.worker + ticket.counter.to_bytes(8, "big")
    ).digest()


@dataclass(frozen=True)
class TicketCounts:
    """What one worker did with the tickets it got here."""

    judged: int
    abandoned: int
    open: int


class TicketBook:
    """A validator's tickets of one run (not thread-safe: the validator holds its lock)."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        run_id: str,
        max_open: int = MAX_OPEN_TICKETS,
        max_open_total: int = 50_000,
        max_workers: int = 200_000,
        grace_s: float = DEFAULT_GRACE_S,
        nonces: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if not 1 <= max_open <= MAX_OPEN_TICKETS:
            raise ValueError(f"max_open must be 1 to {MAX_OPEN_TICKETS}, got {max_open}")
        self.max_open = max_open
        self.max_open_total = max_open_total
        self.max_workers = max_workers
        self.grace_s = grace_s
        self._nonces = nonces
        self._db = open_database(path, _SCHEMA, what="ticket book")
        stored = self._db.execute("SELECT value FROM meta WHERE key = 'run_id'").fetchone()
        if stored is None:
            self._db.execute("INSERT INTO meta VALUES ('run_id', ?)", (run_id,))
            self._db.commit()
        elif stored[0] != run_id:
            raise ValueError(f"{path} holds the tickets of run {stored[0]!r}, not {run_id!r}")

    def close(self) -> None:
        self._db.close()

    # ---- issuing ------------------------------------------------------------------------

    def open_tickets(self, worker: bytes) -> list[Ticket]:
        rows = self._db.execute(
            "SELECT counter, version, nonce FROM tickets WHERE worker = ? ORDER BY counter", (worker,)
        ).fetchall()
        return [Ticket(worker, counter, version, bytes(nonce)) for counter, version, nonce in rows]

    def issue(self, worker: bytes, count: int, version: int, now: float) -> list[Ticket]:
        """The worker's open tickets, topped up with new ones of `version` to `count` (at most `max_open`).

        Returns no new ticket while every worker together holds `max_open_total` open ones."""
        held = self.open_tickets(worker)
        wanted = min(count, self.max_open) - len(held)
        if wanted <= 0:
            return held
        (total,) = self._db.execute("SELECT COUNT(*) FROM tickets").fetchone()
        wanted = min(wanted, self.max_open_total - total)
        if wanted <= 0:
            return held
        row = self._db.execute("SELECT next_counter FROM workers WHERE worker = ?", (worker,)).fetchone()
        if row is None and not self._room_for_a_worker():
            return held
        first = 0 if row is None else int(row[0])
        fresh = [Ticket(worker, first + i, version, self._nonces(TICKET_NONCE_BYTES)) for i in range(wanted)]
        with self._db:
            self._db.executemany(
                "INSERT INTO tickets (worker, counter, version, nonce, issued_at) VALUES (?, ?, ?, ?, ?)",
                [(worker, t.counter, t.policy_version, t.nonce, now) for t in fresh],
            )
            self._db.execute(
                "INSERT INTO workers VALUES (?, ?, 0, 0) "
                "ON CONFLICT (worker) DO UPDATE SET next_counter = excluded.next_counter",
                (worker, first + wanted),
            )
        return held + fresh

    # ---- judging ------------------------------------------------------------------------

    def ticket(self, worker: bytes, counter: int) -> Ticket | None:
        """The open ticket `counter` of `worker`, if there is one."""
        row = self._db.execute(
            "SELECT version, nonce FROM tickets WHERE worker = ? AND counter = ?", (worker, counter)
        ).fetchone()
        return None if row is None else Ticket(worker, counter, int(row[0]), bytes(row[1]))

    def was_issued(self, worker: bytes, counter: int) -> bool:
        """Whether this validator ever issued ticket `counter` to `worker` (open, judged or abandoned)."""
        row = self._db.execute("SELECT next_counter FROM workers WHERE worker = ?", (worker,)).fetchone()
        return row is not None and counter < int(row[0])

    def judged(self, worker: bytes, counter: int) -> None:
        """Close the open ticket `counter`: a group for it was judged."""
        with self._db:
            deleted = self._db.execute(
                "DELETE FROM tickets WHERE worker = ? AND counter = ?", (worker, counter)
            ).rowcount
            if not deleted:
                raise ValueError(f"ticket {counter} is not open")
            self._db.execute("UPDATE workers SET judged = judged + 1 WHERE worker = ?", (worker,))

    # ---- expiry -------------------------------------------------------------------------

    def expire(self, usable: Callable[[int], bool], now: float) -> list[Ticket]:
        """Mark the open tickets whose version is no longer `usable`, and abandon those marked for over
        `grace_s`; returns the tickets abandoned now."""
        versions = [v for (v,) in self._db.execute("SELECT DISTINCT version FROM tickets").fetchall()]
        unusable = [v for v in versions if not usable(v)]
        if not unusable:
            return []
        marks = ",".join("?" * len(unusable))
        with self._db:
            self._db.execute(
                f"UPDATE tickets SET unusable_since = ? WHERE unusable_since IS NULL AND version IN ({marks})",
                (now, *unusable),
            )
            rows = self._db.execute(
                "SELECT worker, counter, version, nonce FROM tickets WHERE unusable_since <= ? "
                "ORDER BY worker, counter",
                (now - self.grace_s,),
            ).fetchall()
            if not rows:
                return []
            self._db.execute("DELETE FROM tickets WHERE unusable_since <= ?", (now - self.grace_s,))
            abandoned = [Ticket(bytes(w), int(c), int(v), bytes(n)) for w, c, v, n in rows]
            per_worker = Counter(t.worker for t in abandoned)
            self._db.executemany(
                "UPDATE workers SET abandoned = abandoned + ? WHERE worker = ?",
                [(count, worker) for worker, count in per_worker.items()],
            )
        return abandoned

    def _room_for_a_worker(self) -> bool:
        """Whether a new worker fits, after forgetting (oldest first) workers that never had a group
        judged and hold no ticket, when the book is full."""
        (workers,) = self._db.execute("SELECT COUNT(*) FROM workers").fetchone()
        if workers < self.max_workers:
            return True
        with self._db:
            self._db.execute(
                "DELETE FROM workers WHERE rowid IN (SELECT rowid FROM workers WHERE judged = 0 AND worker NOT IN "
                "(SELECT DISTINCT worker FROM tickets) ORDER BY rowid LIMIT ?)",
                (max(1, self.max_workers // 10),),
            )
        (workers,) = self._db.execute("SELECT COUNT(*) FROM workers").fetchone()
        return bool(workers < self.max_workers)

    # ---- accounting ---------------------------------------------------------------------

    def counts(self) -> dict[bytes, TicketCounts]:
        """Per worker ever judged or holding tickets: judged, abandoned and open tickets."""
        open_by_worker = dict(
            self._db.execute("SELECT worker, COUNT(*) FROM tickets GROUP BY worker").fetchall()
        )
        return {
            bytes(worker): TicketCounts(int(judged), int(abandoned), int(open_by_worker.get(worker, 0)))
            for worker, judged, abandoned in self._db.execute("SELECT worker, judged, abandoned FROM workers")
        }

    def counts_of(self, worker: bytes) -> TicketCounts:
        row = self._db.execute("SELECT judged, abandoned FROM workers WHERE worker = ?", (worker,)).fetchone()
        (held,) = self._db.execute("SELECT COUNT(*) FROM tickets WHERE worker = ?", (worker,)).fetchone()
        return TicketCounts(0, 0, 0) if row is None else TicketCounts(int(row[0]), int(row[1]), int(held))
