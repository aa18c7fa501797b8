"""A node's small local SQLite databases (a validator's tickets, its forward queue): opened the same way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["open_database"]


def open_database(path: Path | None, schema: str) -> sqlite3.Connection:
    """The database at `path` (created with its directory; None: in memory) with `schema` applied, usable
    from any thread (its owner serialises access with a lock of its own)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
    db.executescript(schema)
    return db
