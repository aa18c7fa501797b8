"""A validator's queue of accepted groups on their way to a trainer: durable, retried, bounded.

A standalone validator tells a worker "accepted" only once the group is in this queue, whose
rows are committed to SQLite (a file beside the node's state): a trainer whose stream slots are
busy, a trainer that restarts, or this validator's own restart lose nothing. A runtime service
(`name`, `async start()`, `async stop()`) drains it: each due group goes to the injected `send`
(which tries the run's trainers and says whether one took it); a group no trainer took is tried
again after a back-off that doubles from `base_backoff_s` to `max_backoff_s`, until its sealed
envelope expires (a trainer would refuse it then), when it is dropped and counted. The queue
holds at most `max_groups`: a validator whose queue is full refuses new groups before judging
them (`full`), so the worker submits them again later rather than lose them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from node.local_db import open_database
from node.runtime import offload

__all__ = ["ForwardQueue", "SendForward"]

logger = logging.getLogger(__name__)

SendForward = Callable[[bytes, list[bytes]], Awaitable[bool]]
"""(sealed group, sealed verdicts) -> whether a trainer took the group."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS forwards (
    id INTEGER PRIMARY KEY,
    sealed_group BLOB NOT NULL,
    verdicts BLOB NOT NULL,
    expires_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL DEFAULT 0
);
"""


def _join(parts: list[bytes]) -> bytes:
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def _split(data: bytes) -> list[bytes]:
    parts, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        parts.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return parts


class ForwardQueue:
    """Accepted groups waiting for a trainer; `put` from the validator, drained on the node's loop."""

    name = "forward-queue"

    def __init__(
        self,
        path: Path | None,
        *,
        send: SendForward,
        max_groups: int = 1024,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        owner: str = "",
    ) -> None:
        if max_groups < 1 or not 0 < base_backoff_s <= max_backoff_s:
            raise ValueError("max_groups must be positive and 0 < base_backoff_s <= max_backoff_s")
        self.send = send
        self.max_groups = max_groups
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.owner = owner
        self._db = open_database(path, _SCHEMA, what="forward queue")
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.forwarded = 0
        """Groups a trainer took."""
        self.retries = 0
        """Attempts that found no trainer to take the group (each is tried again later)."""
        self.expired = 0
        """Groups dropped because no trainer took them before their envelope expired."""

    # ---- the validator's side -------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM forwards").fetchone()
        return int(count)

    def full(self) -> bool:
        return len(self) >= self.max_groups

    def put(self, sealed_group: bytes, verdicts: list[bytes], expires_at: float) -> None:
        """Queue a group durably (committed when this returns); blocking: call it off the event loop."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO forwards (sealed_group, verdicts, expires_at, next_at) VALUES (?, ?, ?, 0)",
                (sealed_group, _join(verdicts), expires_at),
            )
        wake, loop = self._wake, self._loop
        if wake is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the next start drains it
                loop.call_soon_threadsafe(wake.set)

    # ---- draining ---------------------------------------------------------------------------

    async def drain_due(self) -> float | None:
        """Try every due group once; returns when the next one falls due (None: the queue is empty)."""
        now = self.clock()
        rows = await offload(self._due, now)
        for row_id, sealed_group, verdicts, attempts in rows:
            try:
                taken = await self.send(sealed_group, _split(verdicts))
            except Exception as exc:  # a bug in one attempt must not stop the queue
                logger.warning("[%s] forwarding a group failed: %r", self.owner, exc)
                taken = False
            if taken:
                self.forwarded += 1
                await offload(self._delete, row_id)
            else:
                self.retries += 1
                backoff = min(self.max_backoff_s, self.base_backoff_s * 2**attempts)
                await offload(self._retry_later, row_id, self.clock() + backoff)
        return await offload(self._next_due)

    def _due(self, now: float) -> list[tuple[int, bytes, bytes, int]]:
        with self._lock, self._db:
            expired = self._db.execute("DELETE FROM forwards WHERE expires_at <= ?", (now,)).rowcount
            rows = self._db.execute(
                "SELECT id, sealed_group, verdicts, attempts FROM forwards WHERE next_at <= ? ORDER BY id",
                (now,),
            ).fetchall()
        if expired:
            self.expired += expired
            logger.warning(
                "[%s] %d accepted group(s) expired before any trainer took them: not trained on",
                self.owner,
                expired,
            )
        return [(int(i), bytes(g), bytes(v), int(a)) for i, g, v, a in rows]

    def _delete(self, row_id: int) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM forwards WHERE id = ?", (row_id,))

    def _retry_later(self, row_id: int, next_at: float) -> None:
        with self._lock, self._db:
            self._db.execute(
                "UPDATE forwards SET attempts = attempts + 1, next_at = ? WHERE id = ?", (next_at, row_id)
            )

    def _next_due(self) -> float | None:
        with self._lock:
            (next_at,) = self._db.execute("SELECT MIN(next_at) FROM forwards").fetchone()
        return None if next_at is None else float(next_at)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            next_at = await self.drain_due()
            wait_s = None if next_at is None else max(0.0, next_at - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)

    # ---- service --------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._wake, self._loop = None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with self._lock:
            self._db.close()
