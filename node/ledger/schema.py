"""The ledger's SQLite schema: tables, the decoded columns of a receipt, and how kinds are stored.

`SCHEMA_VERSION` is recorded in each ledger's `meta` table; a ledger of another version is refused
rather than misread (a table added later, like `unvouched`, is created in an older ledger on open).
`seq` is SQLite's rowid, so a receipt's position only grows. `unvouched` lists the pulled receipts
whose signers had no standing in the run, with the peer they came from, oldest first: what a full
ledger evicts first (`node.receipts.standing`).
"""

from __future__ import annotations

from protocol.receipts import ReceiptKind

SCHEMA_VERSION = 1
KIND_CODES = {
    ReceiptKind.ROLLOUT: 1,
    ReceiptKind.TRAINING: 2,
    ReceiptKind.TRANSFER: 3,
    ReceiptKind.SEED: 4,
    ReceiptKind.VALIDATION: 5,
}
"""How each kind is stored: a code, once given, never changes (a new kind takes a new code)."""
KIND_OF_CODE = {code: kind for kind, code in KIND_CODES.items()}

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS peers (id INTEGER PRIMARY KEY, peer_id BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY,
    receipt_id BLOB NOT NULL UNIQUE,
    kind INTEGER NOT NULL,
    signer INTEGER NOT NULL REFERENCES peers(id),
    contributor INTEGER NOT NULL REFERENCES peers(id),
    evidence BLOB NOT NULL,
    issued_at REAL NOT NULL,
    step INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    byte_count INTEGER NOT NULL,
    chunks INTEGER NOT NULL,
    count INTEGER NOT NULL,
    accepted INTEGER NOT NULL,
    reason TEXT NOT NULL,
    envelope BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_by_contributor ON receipts (contributor);
CREATE TABLE IF NOT EXISTS pull_cursors (peer BLOB PRIMARY KEY, cursor INTEGER NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS unvouched (receipt_id BLOB PRIMARY KEY, source BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS unvouched_by_source ON unvouched (source);
"""

COLUMNS = (
    "receipt_id, kind, signer, contributor, evidence, issued_at, step, tokens, byte_count, chunks, count, "
    "accepted, reason"
)
