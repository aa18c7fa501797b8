"""A validator's memory of the rollouts it accepted, kept across restarts.

The verifier window (`verification.verifier_window`) refuses a rollout whose hash it accepted
before, for any version it holds, as a replay. Kept in memory only, that would end with the
process: a restarted validator would judge a rollout accepted before the restart afresh (copied
into another assignment, it would be refused for another reason, one that may ban the worker).
`ReplayMemory` keeps the accepted hashes per policy version in SQLite, beside the node's tickets
(`<run>.replays.db`): every accepted group's hashes are written before its verdicts are sealed, and
the window takes a version's hashes back when it holds that version again. Versions too old to be
judged again are forgotten, so the file holds the hashes of about `async_level + 1` versions.

What is read back is bounded: at most `max_hashes` rows (more are never written), each a version
number and a 32-byte hash. A file that is not such a database, belongs to another run, holds a
malformed row or too many rows is moved aside (`<name>.unusable`) with a warning that says why,
and the memory starts empty: the ticket book still refuses every group judged before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from node.local_db import open_database
from protocol.errors import ConfigError

__all__ = ["DEFAULT_MAX_HASHES", "HASH_BYTES", "ReplayMemory"]

logger = logging.getLogger(__name__)

HASH_BYTES = 32
"""A rollout hash is a sha256 (`protocol.rollout_messages.rollout_hash`)."""
DEFAULT_MAX_HASHES = 500_000
"""About 16 MiB of hashes on disk; a window of three versions of tens of thousands of rollouts each fits."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS accepted (
    version INTEGER NOT NULL,
    hash BLOB NOT NULL,
    PRIMARY KEY (version, hash)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class _Unusable(Exception):
    """Why a replay memory file cannot be read back."""


class ReplayMemory:
    """Accepted rollout hashes per policy version, in a file (or memory); not thread-safe: the
    validator holds its lock."""

    def __init__(
        self, path: Path | None = None, *, run_id: str, max_hashes: int = DEFAULT_MAX_HASHES
    ) -> None:
        if max_hashes < 1:
            raise ValueError(f"max_hashes must be >= 1, got {max_hashes}")
        self.path = path
        self.run_id = run_id
        self.max_hashes = max_hashes
        self._full_warned = False
        self._db, self._recalled = self._open()
        self._stored = sum(len(hashes) for hashes in self._recalled.values())

    def close(self) -> None:
        self._db.close()

    def recall(self, version: int) -> set[bytes]:
        """The hashes remembered for `version` when the memory was opened (once: the window keeps them)."""
        return self._recalled.pop(version, set())

    def remember(self, version: int, hashes: Iterable[bytes]) -> None:
        """Record accepted rollouts of `version` (beyond `max_hashes` stored, in memory only: one warning)."""
        fresh = list(hashes)
        room = max(0, self.max_hashes - self._stored)
        if len(fresh) > room and not self._full_warned:
            self._full_warned = True
            logger.warning(
                "replay memory %s holds %d hashes, its limit: rollouts accepted from now on are refused as "
                "replays until this process ends only",
                self.path, self._stored,
            )  # fmt: skip
        with self._db:
            written = self._db.executemany(
                "INSERT OR IGNORE INTO accepted (version, hash) VALUES (?, ?)",
                [(version, h) for h in fresh[:room]],
            ).rowcount
        self._stored += max(0, written)

    def forget_before(self, version: int) -> None:
        """Forget every version older than `version` (it can never be judged again)."""
        for old in [v for v in self._recalled if v < version]:
            del self._recalled[old]
        with self._db:
            deleted = self._db.execute("DELETE FROM accepted WHERE version < ?", (version,)).rowcount
        self._stored -= max(0, deleted)

    # ---- opening ------------------------------------------------------------------------

    def _open(self) -> tuple[sqlite3.Connection, dict[int, set[bytes]]]:
        """The database and what it remembers, or a fresh one if the file cannot be read back."""
        db: sqlite3.Connection | None = None
        try:
            db = open_database(self.path, _SCHEMA, what="replay memory")
            return db, self._load(db)
        except (sqlite3.DatabaseError, ConfigError, _Unusable) as exc:
            if db is not None:
                db.close()
            return self._start_afresh(str(exc)), {}

    def _load(self, db: sqlite3.Connection) -> dict[int, set[bytes]]:
        stored = db.execute("SELECT value FROM meta WHERE key = 'run_id'").fetchone()
        if stored is None:
            with db:
                db.execute("INSERT INTO meta VALUES ('run_id', ?)", (self.run_id,))
        elif stored[0] != self.run_id:
            raise _Unusable(f"it belongs to run {stored[0]!r}, not {self.run_id!r}")
        rows = db.execute("SELECT version, hash FROM accepted LIMIT ?", (self.max_hashes + 1,)).fetchall()
        if len(rows) > self.max_hashes:
            raise _Unusable(f"it holds more than {self.max_hashes} hashes")
        loaded: dict[int, set[bytes]] = {}
        for version, digest in rows:
            if (
                type(version) is not int
                or version < 0
                or type(digest) is not bytes
                or len(digest) != HASH_BYTES
            ):
                raise _Unusable(f"it holds a malformed row ({version!r}, {digest!r:.80})")
            loaded.setdefault(version, set()).add(digest)
        return loaded

    def _start_afresh(self, why: str) -> sqlite3.Connection:
        """Move the unusable file (and its journal) aside and open an empty memory in its place."""
        assert self.path is not None, "a memory in memory is always usable"
        aside = self.path.with_name(self.path.name + ".unusable")
        try:
            for suffix in ("", "-journal", "-wal", "-shm"):
                source = Path(str(self.path) + suffix)
                if source.exists():
                    os.replace(source, Path(str(aside) + suffix))
            db = open_database(self.path, _SCHEMA)
            with db:
                db.execute("INSERT INTO meta VALUES ('run_id', ?)", (self.run_id,))
        except (OSError, sqlite3.DatabaseError, ConfigError) as exc:
            logger.warning(
                "replay memory %s is unusable (%s) and cannot be replaced (%r): rollouts accepted before this "
                "start are not refused as replays, and those accepted from now on only until it ends",
                self.path, why, exc,
            )  # fmt: skip
            return open_database(None, _SCHEMA)
        logger.warning(
            "replay memory %s is unusable (%s): moved to %s; rollouts accepted before this start are not "
            "refused as replays",
            self.path, why, aside,
        )  # fmt: skip
        return db
