"""A corrupt local database (a validator's tickets, its forward queue) gives a clear error and is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.local_db import open_database
from node.rollouts.forward_queue import ForwardQueue
from protocol.errors import ConfigError
from verification.tickets import TicketBook

SCHEMA = "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY);"
GARBAGE = b"this was never an SQLite file, or it was overwritten" * 200


def test_a_file_that_is_not_a_database_is_named_with_what_to_do_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(GARBAGE)
    with pytest.raises(ConfigError, match=r"x\.db is not a usable ticket book .*move it aside"):
        open_database(path, SCHEMA, what="ticket book")
    assert path.read_bytes() == GARBAGE


def test_a_healthy_file_opens_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.db"
    db = open_database(path, SCHEMA)
    with db:
        db.execute("INSERT INTO t VALUES (7)")
    db.close()
    again = open_database(path, SCHEMA)
    assert again.execute("SELECT k FROM t").fetchall() == [(7,)]
    again.close()


def test_a_corrupt_ticket_book_or_forward_queue_raises_a_config_error(tmp_path: Path) -> None:
    tickets, forwards = tmp_path / "run.tickets.db", tmp_path / "run.forwards.db"
    tickets.write_bytes(GARBAGE)
    forwards.write_bytes(GARBAGE)
    with pytest.raises(ConfigError, match="ticket book"):
        TicketBook(tickets, run_id="run")
    with pytest.raises(ConfigError, match="forward queue"):
        ForwardQueue(forwards, send=None)  # type: ignore[arg-type]
