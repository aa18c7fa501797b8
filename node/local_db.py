"""A node's small local SQLite databases (a validator's tickets, its forward queue): opened the same way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from protocol.errors import ConfigError

__all__ = ["open_database"]


def open_database(path: Path | None, schema: str, *, what: str = "database") -> sqlite3.Connection:
    """The database at `path` (created with its directory; None: in memory) with `schema` applied, usable
    from any thread (its owner serialises access with a lock of its own).

    A file that SQLite cannot read (truncated, overwritten, not a database) raises `ConfigError`
    naming it and what to do: the file is left as it is, so that nothing in it is lost."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
    try:
        db.executescript(schema)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise ConfigError(
            f"{path} is not a usable {what} ({exc}): move it aside (or restore it from a backup) and start "
            "again; the node then starts an empty one in its place"
        ) from None
    return db
