"""The ledger: a SQLite store (standard library, WAL) of verified receipts of one run.

Every receipt is re-verified (`protocol.receipts.open_receipt`: canonical encoding, signature,
run, kind, caps, expiry, not self-issued) before it is stored. The receipt id (sha256 of the
envelope bytes) is the primary key, so adding a receipt twice is a no-op, and a receipt already
stored is recognised by its id without checking its signature again. `add_many` verifies a batch
and inserts it in one transaction, which is what makes bulk intake fast. The raw envelope is
stored beside the decoded columns, so an export is exactly the signed bytes that were received.
Receipts are never deleted, so their position (`seq`) only grows: an export is a consistent
snapshot even while receipts keep arriving, and `page(after, limit)` is a cursor a peer can resume
from (the receipts exchange, `node.receipts`, serves a ledger this way). `seq` is SQLite's rowid, in
the schema since version 1, so ledgers written before the exchange existed serve as they are.
The exchange also keeps, in a small table of its own, the cursor it reached in each peer's ledger
(`save_pull_cursor`, `pull_cursors`), so a restarted node resumes its pulls.

One `Ledger` may be used from several threads (a node's loop offloads to worker threads): one
connection guarded by a lock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.ledger.credit import DEFAULT_HALF_LIFE_S, CreditRates, CreditReport, compute_credit
from node.ledger.export import write_export
from node.ledger.schema import COLUMNS, KIND_CODES, KIND_OF_CODE, SCHEMA, SCHEMA_VERSION
from node.ledger.signers import RunSigners
from protocol.errors import ConfigError, InvalidMessage
from protocol.receipts import MAX_RECEIPT_BYTES, Receipt, ReceiptKind, open_receipt, receipt_id

_READ_BATCH = 10_000
"""Rows read per query when iterating over the ledger (the lock is released between batches)."""
_LOOKUP_BATCH = 500
"""Ids per `IN (...)` query when looking up which receipts of a batch are already stored."""
_CACHE_KIB = 64 * 1024
"""SQLite page cache of a ledger connection (the default is 2 MiB)."""
_CHECKPOINT_PAGES = 40_000
"""WAL pages (4 KiB each) between automatic checkpoints (the default is 1,000)."""
_WAL_KEEP_BYTES = 32 * 1024 * 1024
"""What the WAL file is cut back to after a checkpoint (else it keeps its largest size until closed)."""


@dataclass(frozen=True, slots=True)
class StoredEnvelope:
    """One stored receipt as the exchange serves it: its ledger position, issue time and signed bytes."""

    seq: int
    issued_at: float
    envelope: bytes


@dataclass(frozen=True, slots=True)
class ContributorReceipts:
    """One contributor's newest receipts, read without decoding the others (a dashboard's node page)."""

    newest: list[Receipt]
    """Its newest receipts, newest first."""
    newest_rejected: list[Receipt]
    """Its newest rejected rollouts, newest first, with their envelopes."""


@dataclass
class AddResult:
    """What a batch did: receipts stored, already present, and refused (position in the batch, reason)."""

    added: int = 0
    duplicates: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)


class Ledger:
    """The receipts of one run in a SQLite file; see the module docstring."""

    def __init__(self, path: Path | str, run_id: str | None = None) -> None:
        """Open (or create) the ledger at `path`. `run_id` may be omitted for an existing ledger."""
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "PRAGMA synchronous=NORMAL"
            )  # durable at each checkpoint; WAL keeps it consistent
            # Receipt ids are random, so every batch dirties index pages all over a large ledger: a
            # bigger page cache and rarer checkpoints copy each such page to the file fewer times.
            self._db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            self._db.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={_WAL_KEEP_BYTES}")
            self._db.executescript(SCHEMA)
            self.run_id = self._bind_run(run_id)
        except (sqlite3.DatabaseError, ConfigError) as exc:
            self._db.close()
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{self.path} is not a usable ledger: {exc}") from None
        self._peer_ids: dict[bytes, int] = {}
        self._peers: dict[int, bytes] = {}
        self._load_peers()

    def _bind_run(self, run_id: str | None) -> str:
        meta = dict(self._db.execute("SELECT key, value FROM meta"))
        if meta and int(meta.get("schema_version", -1)) != SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path} has ledger schema {meta.get('schema_version')}, expected {SCHEMA_VERSION}"
            )
        stored = meta.get("run_id")
        if stored is None:
            if run_id is None:
                raise ConfigError(f"{self.path} is a new ledger: give the run it records")
            self._db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("schema_version", str(SCHEMA_VERSION)), ("run_id", run_id)],
            )
            return run_id
        if run_id is not None and run_id != stored:
            raise ConfigError(f"{self.path} records run {stored!r}, not {run_id!r}")
        return stored

    # --- intake ---

    def add(self, envelope: bytes, *, now: float | None = None) -> bool:
        """Verify and store one receipt; True if new, False if already stored; InvalidMessage if refused."""
        result = self.add_many([envelope], now=now)
        if result.refused:
            raise InvalidMessage(result.refused[0][1])
        return result.added == 1

    def add_many(
        self, envelopes: Iterable[bytes], *, now: float | None = None, audit: bool = False
    ) -> AddResult:
        """Verify a batch and store its new valid receipts in one transaction.

        `audit=True` admits receipts that were valid when issued even if they have expired since
        (importing an export); otherwise a receipt must be unexpired at `now`.
        """
        now = time.time() if now is None else now
        batch = list(envelopes)
        result = AddResult()
        # only what could be a receipt is hashed (open_receipt refuses the rest with its reason)
        ids = [
            receipt_id(data) if isinstance(data, bytes) and len(data) <= MAX_RECEIPT_BYTES else b""
            for data in batch
        ]
        with self._lock:
            stored = self._stored_ids(ids)
        verified: dict[bytes, Receipt] = {}
        for position, (data, rid) in enumerate(zip(batch, ids, strict=True)):
            if rid in stored or rid in verified:
                result.duplicates += 1
                continue
            try:
                verified[rid] = open_receipt(data, run_id=self.run_id, now=now, audit=audit)
            except InvalidMessage as exc:
                result.refused.append((position, str(exc)))
        if verified:
            with self._lock:  # verification ran unlocked, so another batch may have stored some meanwhile
                result.added = self._insert(verified.values())
            result.duplicates += len(verified) - result.added
        return result

    def _insert(self, receipts: Iterable[Receipt]) -> int:
        """Insert in one transaction; returns how many were new."""
        self._db.execute("BEGIN")
        try:
            rows = [self._row(receipt) for receipt in receipts]
            before = self._db.total_changes
            self._db.executemany(
                f"INSERT OR IGNORE INTO receipts ({COLUMNS}, envelope) VALUES ({', '.join('?' * 14)})", rows
            )
            added = self._db.total_changes - before
            self._db.execute("COMMIT")
            return added
        except BaseException:
            self._db.execute("ROLLBACK")
            self._load_peers()  # peers added in the rolled-back transaction are gone
            raise

    def _load_peers(self) -> None:
        self._peer_ids = dict(self._db.execute("SELECT peer_id, id FROM peers"))
        self._peers = {index: peer for peer, index in self._peer_ids.items()}

    # Another connection (a node's process while a dashboard or a CLI reads the same file) may have
    # stored receipts of peers this one has not loaded yet: look them up again before giving up.
    def _peer_of(self, index: int) -> bytes:
        peer = self._peers.get(index)
        if peer is None:
            with self._lock:
                self._load_peers()
            peer = self._peers[index]
        return peer

    def _peer_index(self, peer_id: bytes) -> int | None:
        if peer_id not in self._peer_ids:
            with self._lock:
                self._load_peers()
        return self._peer_ids.get(peer_id)

    def _stored_ids(self, ids: list[bytes]) -> set[bytes]:
        found: set[bytes] = set()
        for start in range(0, len(ids), _LOOKUP_BATCH):
            part = ids[start : start + _LOOKUP_BATCH]
            query = f"SELECT receipt_id FROM receipts WHERE receipt_id IN ({', '.join('?' * len(part))})"
            found.update(row[0] for row in self._db.execute(query, part))
        return found

    def _peer(self, peer_id: bytes) -> int:
        index = self._peer_ids.get(peer_id)
        if index is None:
            # another connection to the same file may have stored this peer since we loaded ours
            self._db.execute("INSERT OR IGNORE INTO peers (peer_id) VALUES (?)", (peer_id,))
            (index,) = self._db.execute("SELECT id FROM peers WHERE peer_id = ?", (peer_id,)).fetchone()
            self._peer_ids[peer_id] = index
            self._peers[index] = peer_id
        return index

    def _row(self, receipt: Receipt) -> tuple[object, ...]:
        return (
            receipt.receipt_id,
            KIND_CODES[receipt.kind],
            self._peer(receipt.signer),
            self._peer(receipt.contributor),
            receipt.evidence,
            receipt.issued_at,
            receipt.step,
            receipt.tokens,
            receipt.byte_count,
            receipt.chunks,
            receipt.count,
            int(receipt.accepted),
            receipt.reason,
            receipt.envelope,
        )

    # --- reading ---

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0])

    def receipts(
        self, *, contributor: bytes | None = None, with_envelopes: bool = False
    ) -> Iterator[Receipt]:
        """Stored receipts in the order they were stored (all, or one contributor's), read in batches."""
        columns = COLUMNS + (", envelope" if with_envelopes else "")
        where = ""
        args: tuple[object, ...] = ()
        if contributor is not None:
            index = self._peer_index(contributor)
            if index is None:
                return
            where, args = "AND contributor = ?", (index,)
        query = f"SELECT seq, {columns} FROM receipts WHERE seq > ? {where} ORDER BY seq LIMIT {_READ_BATCH}"
        for row in self._batches(query, args):
            yield self._receipt(row[1:])

    def contributor_receipts(self, contributor: bytes, *, newest: int) -> ContributorReceipts:
        """`contributor`'s newest receipts and newest rejected rollouts, at most `newest` of each."""
        index = self._peer_index(contributor)
        if index is None:
            return ContributorReceipts([], [])
        with self._lock:
            newest_rows = self._db.execute(
                f"SELECT {COLUMNS} FROM receipts WHERE contributor = ? ORDER BY seq DESC LIMIT ?",
                (index, int(newest)),
            ).fetchall()
            rejected_rows = self._db.execute(
                f"SELECT {COLUMNS}, envelope FROM receipts WHERE contributor = ? AND kind = ? AND accepted = 0 "
                "ORDER BY seq DESC LIMIT ?",
                (index, KIND_CODES[ReceiptKind.ROLLOUT], int(newest)),
            ).fetchall()
        return ContributorReceipts(
            newest=[self._receipt(row) for row in newest_rows],
            newest_rejected=[self._receipt(row) for row in rejected_rows],
        )

    def _batches(self, query: str, args: tuple[object, ...]) -> Iterator[tuple[Any, ...]]:
        """Rows of `query` (whose first column is seq and first parameter a seq bound), batch after batch."""
        last = 0
        while True:
            with self._lock:
                rows = self._db.execute(query, (last, *args)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield from rows

    def get(self, receipt_id: bytes) -> Receipt | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {COLUMNS}, envelope FROM receipts WHERE receipt_id = ?", (receipt_id,)
            ).fetchone()
        return None if row is None else self._receipt(row)

    def envelopes(self, *, upto: int | None = None) -> Iterator[bytes]:
        """Every stored envelope (stored at or before position `upto` if given), in the order stored."""
        bound = "" if upto is None else f"AND seq <= {int(upto)}"
        query = f"SELECT seq, envelope FROM receipts WHERE seq > ? {bound} ORDER BY seq LIMIT {_READ_BATCH}"
        for row in self._batches(query, ()):
            yield bytes(row[1])

    def page(self, after: int, limit: int) -> list[StoredEnvelope]:
        """At most `limit` receipts stored after position `after`, in the order stored."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, issued_at, envelope FROM receipts WHERE seq > ? ORDER BY seq LIMIT ?",
                (int(after), int(limit)),
            ).fetchall()
        return [StoredEnvelope(seq=row[0], issued_at=row[1], envelope=bytes(row[2])) for row in rows]

    def stored(self, ids: Iterable[bytes]) -> set[bytes]:
        """Which of these receipt ids the ledger already holds."""
        with self._lock:
            return self._stored_ids(list(ids))

    # --- the receipts exchange's pull cursors (each peer's ledger position reached by pulling it) ---

    def pull_cursors(self) -> list[tuple[bytes, int]]:
        """Every remembered (peer, cursor), least recently saved first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT peer, cursor FROM pull_cursors ORDER BY updated_at, rowid"
            ).fetchall()
        return [(bytes(peer), int(cursor)) for peer, cursor in rows]

    def save_pull_cursor(self, peer: bytes, cursor: int, *, keep: int, now: float | None = None) -> None:
        """Remember `peer`'s cursor, then forget all but the `keep` most recently saved peers."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute(
                    "INSERT INTO pull_cursors (peer, cursor, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (peer) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at",
                    (peer, int(cursor), now),
                )
                self._db.execute(
                    "DELETE FROM pull_cursors WHERE peer NOT IN "
                    "(SELECT peer FROM pull_cursors ORDER BY updated_at DESC, rowid DESC LIMIT ?)",
                    (int(keep),),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # --- pulled receipts of signers without standing (`node.receipts.standing`) ---

    def mark_unvouched(self, ids: Iterable[bytes], source: bytes) -> None:
        """Note stored receipts as pulled from `source` although their signers had no standing."""
        with self._lock:
            self._db.executemany(
                "INSERT OR IGNORE INTO unvouched (receipt_id, source) VALUES (?, ?)",
                [(i, source) for i in ids],
            )

    def unvouched_count(self, source: bytes | None = None) -> int:
        """Receipts noted unvouched (from `source`, or from anyone)."""
        query, args = "SELECT COUNT(*) FROM unvouched", tuple[bytes, ...]()
        if source is not None:
            query, args = query + " WHERE source = ?", (source,)
        with self._lock:
            (count,) = self._db.execute(query, args).fetchone()
        return int(count)

    def evict_unvouched(self, keep: int) -> int:
        """Delete the oldest unvouched receipts until `keep` are left; returns how many went."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                doomed = "SELECT receipt_id FROM unvouched ORDER BY rowid DESC LIMIT -1 OFFSET ?"
                gone = self._db.execute(
                    f"DELETE FROM receipts WHERE receipt_id IN ({doomed})", (keep,)
                ).rowcount
                self._db.execute(f"DELETE FROM unvouched WHERE receipt_id IN ({doomed})", (keep,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return int(gone)

    def credited_by(self, signers: Iterable[bytes]) -> set[bytes]:
        """The contributors of receipts signed by any of `signers` (who earned credit from them)."""
        with self._lock:
            indexes = [i for i in (self._peer_ids.get(s) for s in signers) if i is not None]
            if not indexes:
                return set()
            rows = self._db.execute(
                f"SELECT DISTINCT contributor FROM receipts WHERE accepted = 1 AND signer IN "
                f"({', '.join('?' * len(indexes))})",
                indexes,
            ).fetchall()
            return {self._peers[index] for (index,) in rows}

    def export(self, out: Path) -> int:
        """Write every receipt stored so far to `out` (`node.ledger.export` format); returns the count.

        Receipts added while it runs are left for the next export (positions only grow).
        """
        with self._lock:
            upto, count = self._db.execute("SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM receipts").fetchone()
        return write_export(self.envelopes(upto=upto), out, run_id=self.run_id, count=count)

    def _receipt(self, row: tuple[Any, ...]) -> Receipt:
        (
            rid,
            kind,
            signer,
            contributor,
            evidence,
            issued,
            step,
            tokens,
            nbytes,
            chunks,
            count,
            accepted,
            reason,
        ) = row[:13]
        return Receipt(
            receipt_id=bytes(rid),
            kind=KIND_OF_CODE[kind],
            signer=self._peer_of(signer),
            contributor=self._peer_of(contributor),
            run_id=self.run_id,
            evidence=bytes(evidence),
            issued_at=issued,
            step=step,
            tokens=tokens,
            byte_count=nbytes,
            chunks=chunks,
            count=count,
            accepted=bool(accepted),
            reason=reason,
            envelope=bytes(row[13]) if len(row) > 13 else b"",
        )

    def credit(
        self,
        *,
        trusted: Iterable[bytes] | RunSigners,
        now: float | None = None,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        rates: CreditRates | None = None,
    ) -> CreditReport:
        """Credit from every stored receipt (`node.ledger.credit.compute_credit`)."""
        return compute_credit(
            self.receipts(),
            trusted=trusted,
            now=time.time() if now is None else now,
            half_life_s=half_life_s,
            rates=rates,
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
