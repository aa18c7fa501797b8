"""Ledger exports and their offline audit.

Format (JSON lines, UTF-8, so that standard tools can read it):
- line 1, a header: `{"format": "hivenet-ledger", "version": 1, "run_id": R, "receipts": N,
  "exported_at": T}`;
- then one line per receipt: `{"receipt": "<base64 of the signed envelope bytes>"}`.

Nothing but the signed envelopes is trusted: `audit_export` re-opens every one of them
(`open_receipt(audit=True)`: signature, run, caps, self-issue, as of when it was issued), reports
each line that fails with its line number and reason, and recomputes every credit total from the
receipts that verify. The header's count is only compared, to notice a truncated file.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from node.ledger.credit import DEFAULT_HALF_LIFE_S, CreditRates, CreditReport, compute_credit
from node.ledger.signers import RunSigners
from protocol.errors import InvalidMessage
from protocol.receipts import MAX_RECEIPT_BYTES, Receipt, open_receipt

EXPORT_FORMAT = "hivenet-ledger"
EXPORT_VERSION = 1
MAX_LINE_BYTES = 4 * MAX_RECEIPT_BYTES
"""Longest line read: a receipt's base64 with its JSON wrapping fits with room to spare."""


def write_export(envelopes: Iterable[bytes], out: Path, *, run_id: str, count: int) -> int:
    """Write `envelopes` (`count` of them) to `out` in the export format; returns how many were written."""
    written = 0
    tmp = out.with_name(out.name + ".partial")
    with tmp.open("w", encoding="utf-8") as handle:
        header = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "run_id": run_id,
            "receipts": count,
            "exported_at": time.time(),
        }
        handle.write(json.dumps(header) + "\n")
        for envelope in envelopes:
            handle.write('{"receipt": "' + base64.b64encode(envelope).decode("ascii") + '"}\n')
            written += 1
    if written != count:
        tmp.unlink()
        raise InvalidMessage(f"ledger changed during the export ({written} receipts read, {count} expected)")
    tmp.replace(out)
    return written


@dataclass
class AuditReport:
    """The outcome of re-verifying an export."""

    run_id: str
    declared: int
    """Receipts the header says the file holds."""
    valid: int = 0
    duplicates: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    """(line number, reason) for every line that failed."""
    credit: CreditReport | None = None

    @property
    def lines_read(self) -> int:
        return self.valid + self.duplicates + len(self.invalid)

    @property
    def ok(self) -> bool:
        return not self.invalid and self.lines_read == self.declared


def _lines(handle: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) with each line capped; None for a line over the cap (skipped to its end)."""
    number = 1
    while True:
        number += 1
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            while line and not line.endswith(b"\n"):
                line = handle.readline(MAX_LINE_BYTES + 1)
            yield number, None
            continue
        yield number, line


def _header(handle: IO[bytes]) -> dict[str, Any]:
    line = handle.readline(MAX_LINE_BYTES + 1)
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if (
        not isinstance(header, dict)
        or header.get("format") != EXPORT_FORMAT
        or header.get("version") != EXPORT_VERSION
        or not isinstance(header.get("run_id"), str)
        or not isinstance(header.get("receipts"), int)
    ):
        raise InvalidMessage(f"not a {EXPORT_FORMAT} v{EXPORT_VERSION} export (bad header line)")
    return header


def _envelope_of(line: bytes) -> bytes:
    try:
        entry = json.loads(line)
        text = entry["receipt"]
        if not isinstance(text, str):
            raise TypeError("receipt is not a string")
        return base64.b64decode(text, validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidMessage(f"malformed line: {exc}") from None


def export_run(path: Path) -> str:
    """The run an export's header names (InvalidMessage if it is not an export)."""
    with path.open("rb") as handle:
        return str(_header(handle)["run_id"])


def export_envelopes(path: Path) -> Iterator[tuple[int, bytes | str]]:
    """(line number, envelope bytes) for each receipt line of an export, or (line number, reason) for
    a line that does not even decode; the envelopes themselves are not verified here."""
    with path.open("rb") as handle:
        _header(handle)
        for number, line in _lines(handle):
            if line is None:
                yield number, f"line longer than {MAX_LINE_BYTES} bytes"
                continue
            try:
                yield number, _envelope_of(line)
            except InvalidMessage as exc:
                yield number, str(exc)


def _verified(handle: IO[bytes], report: AuditReport) -> Iterator[Receipt]:
    """The receipts of an open export that verify, once each, recording every failure in `report`."""
    seen: set[bytes] = set()
    for number, line in _lines(handle):
        if line is None:
            report.invalid.append((number, f"line longer than {MAX_LINE_BYTES} bytes"))
            continue
        try:
            receipt = open_receipt(_envelope_of(line), run_id=report.run_id, audit=True)
        except InvalidMessage as exc:
            report.invalid.append((number, str(exc)))
            continue
        if receipt.receipt_id in seen:
            report.duplicates += 1
            continue
        seen.add(receipt.receipt_id)
        report.valid += 1
        yield receipt


def audit_export(
    path: Path,
    *,
    run_id: str | None = None,
    trusted: Iterable[bytes] | RunSigners = (),
    now: float | None = None,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    rates: CreditRates | None = None,
) -> AuditReport:
    """Re-verify every receipt of the export at `path` (of `run_id`, default the header's run) and
    recompute the credit of those that verify; receipts are streamed, never all held in memory."""
    with path.open("rb") as handle:
        header = _header(handle)
        report = AuditReport(
            run_id=header["run_id"] if run_id is None else run_id, declared=header["receipts"]
        )
        report.credit = compute_credit(
            _verified(handle, report),
            trusted=trusted,
            now=time.time() if now is None else now,
            half_life_s=half_life_s,
            rates=rates,
        )
    return report
