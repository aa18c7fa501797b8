"""`hivenet ledger`: export a node's receipts and audit an export offline.

- `export --db PATH --out FILE`: write every receipt of a ledger as JSON lines (a header line,
  then `{"receipt": "<base64 envelope>"}` per receipt; see `node.ledger.export`).
- `import FILE --db PATH`: add an export's receipts to a ledger, each re-verified as of when it
  was issued (so an old export imports whole); exits 1 if any line is refused.
- `verify FILE [--run R] [--trainer P ...] [--validator P ...] [--trusted P ...] [--json]`:
  re-check every signature and recompute every total from the receipts alone, then print the
  per-contributor credit table. A receipt counts only when signed by a peer whose role the run
  gives its kind (rollout verdicts: the run's validators and trainers; training and validation
  receipts: its trainers; `--trusted` peers: every kind), or, for transfer and seed receipts only and capped, by
  a signer that earned credit from them; other receipts show in the "untrusted" column. Exits 1
  when any line fails or the file is shorter than its header says.
- `credit --db PATH [--trainer ...] [--validator ...] [--trusted ...] [--json]`: the same table
  straight from a ledger.

Nothing heavy is imported at module level, so `hivenet --help` stays fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.errors import friendly_errors

if TYPE_CHECKING:
    from node.ledger import AuditReport, CreditReport, RunSigners

_ROLES = ("inference", "trainer", "broadcast", "seed", "validator")
_MAX_SHOWN_INVALID = 20
_IMPORT_BATCH = 5000


@click.group()
def ledger() -> None:
    """Contribution receipts: export a ledger, audit an export offline."""


def _peer_ids(texts: Iterable[str], option: str = "--trusted") -> list[bytes]:
    from hivemind.p2p import PeerID

    from protocol.errors import InvalidMessage
    from protocol.peer_keys import check_ed25519_peer_id

    peers = []
    for text in texts:
        try:
            peer = PeerID.from_base58(text).to_bytes()
            check_ed25519_peer_id(peer)
        except (ValueError, InvalidMessage) as exc:
            raise click.BadParameter(
                f"{text!r} is not an Ed25519 PeerID ({exc})", param_hint=option
            ) from None
        peers.append(peer)
    return peers


def _base58(peer: bytes) -> str:
    from hivemind.p2p import PeerID

    return str(PeerID(peer).to_base58())


SIGNER_OPTIONS = [
    click.option(
        "--trainer",
        "--publisher",
        "trainers",
        multiple=True,
        metavar="PEERID",
        help="Base58 PeerID of one of the run's trainers (repeatable; the PeerIDs its nodes take with "
        "--publisher): its training receipts count, and its rollout verdicts (each trainer runs a validator).",
    ),
    click.option(
        "--validator",
        "--trusted-validator",
        "validators",
        multiple=True,
        metavar="PEERID",
        help="Base58 PeerID of one of the run's standalone validators (repeatable; the PeerIDs its nodes take "
        "with --trusted-validator): its rollout verdicts count.",
    ),
    click.option(
        "--trusted",
        "trusted",
        multiple=True,
        metavar="PEERID",
        help="Base58 PeerID trusted to sign every kind of receipt (repeatable). Transfer and seed receipts "
        "count from any of these signers; verdicts only from trainers and validators.",
    ),
]


def signer_options(func: Any) -> Any:
    """`--trainer`, `--validator` and `--trusted` (see `run_signers`)."""
    for option in reversed(SIGNER_OPTIONS):
        func = option(func)
    return func


def run_signers(trusted: Iterable[str], trainers: Iterable[str], validators: Iterable[str]) -> RunSigners:
    """The run's signers by role from the signer options; each PeerID checked."""
    from node.ledger import RunSigners

    trainer_ids = frozenset(_peer_ids(trainers, "--trainer"))
    return RunSigners.for_every_kind(_peer_ids(trusted, "--trusted")).union(
        RunSigners(
            validators=trainer_ids | frozenset(_peer_ids(validators, "--validator")), trainers=trainer_ids
        )
    )


_credit_options = [
    *SIGNER_OPTIONS,
    click.option(
        "--half-life-days",
        type=click.FloatRange(min=0, min_open=True),
        default=1.0,
        show_default=True,
        help="Half-life of the recent average.",
    ),
    click.option("--at", "at", type=float, help="Unix time to compute the recent average at (default: now)."),
    click.option(
        "--top", type=click.IntRange(min=1), default=25, show_default=True, help="Rows in the table."
    ),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every contributor)."),
]


def credit_options(func: Any) -> Any:
    for option in reversed(_credit_options):
        func = option(func)
    return func


@ledger.command("export")
@click.option("--db", "db", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@friendly_errors
def export(db: Path, out: Path) -> None:
    """Write every receipt of the ledger DB to FILE (JSON lines of base64 signed envelopes)."""
    from node.ledger import Ledger

    with Ledger(db) as store:
        written = store.export(out)
        click.echo(f"exported {written} receipts of run {store.run_id} to {out}")


@ledger.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--run", "run_id", help="The run of the ledger (default: the export's header).")
@friendly_errors
def import_(file: Path, db: Path, run_id: str | None) -> None:
    """Add the receipts of an export to the ledger DB, each re-verified (as of when it was issued)."""
    from node.ledger import Ledger, export_envelopes, export_run

    added = duplicates = 0
    refused: list[tuple[int, str]] = []
    with Ledger(db, run_id or export_run(file)) as store:
        batch: list[tuple[int, bytes]] = []

        def flush() -> None:
            nonlocal added, duplicates
            result = store.add_many([data for _, data in batch], audit=True)
            added, duplicates = added + result.added, duplicates + result.duplicates
            refused.extend((batch[position][0], reason) for position, reason in result.refused)
            batch.clear()

        for number, item in export_envelopes(file):
            if isinstance(item, str):
                refused.append((number, item))
                continue
            batch.append((number, item))
            if len(batch) >= _IMPORT_BATCH:
                flush()
        flush()
        click.echo(f"imported {added} receipts into {db} (run {store.run_id}); {duplicates} already there")
    for number, reason in sorted(refused)[:_MAX_SHOWN_INVALID]:
        click.secho(f"  line {number} refused: {reason}", fg="red", err=True)
    if refused:
        click.secho(f"{len(refused)} line(s) refused", fg="red", err=True)
        raise SystemExit(1)


@ledger.command("verify")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--run", "run_id", help="The run every receipt must belong to (default: the file's header).")
@credit_options
@friendly_errors
def verify(
    file: Path,
    run_id: str | None,
    trainers: tuple[str, ...],
    validators: tuple[str, ...],
    trusted: tuple[str, ...],
    half_life_days: float,
    at: float | None,
    top: int,
    as_json: bool,
) -> None:
    """Re-check every signature in an export and recompute every credit total offline."""
    from node.ledger import audit_export

    report = audit_export(
        file,
        run_id=run_id,
        trusted=run_signers(trusted, trainers, validators),
        now=time.time() if at is None else at,
        half_life_s=half_life_days * 86400,
    )
    assert report.credit is not None
    if as_json:
        click.echo(json.dumps(_audit_json(report), indent=2))
    else:
        _print_audit(report, top)
    if not report.ok:
        raise SystemExit(1)


@ledger.command("credit")
@click.option("--db", "db", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@credit_options
@friendly_errors
def credit(
    db: Path,
    trainers: tuple[str, ...],
    validators: tuple[str, ...],
    trusted: tuple[str, ...],
    half_life_days: float,
    at: float | None,
    top: int,
    as_json: bool,
) -> None:
    """Show the credit table of a ledger DB."""
    from node.ledger import Ledger

    with Ledger(db) as store:
        report = store.credit(
            trusted=run_signers(trusted, trainers, validators), now=at, half_life_s=half_life_days * 86400
        )
        run_id = store.run_id
    if as_json:
        click.echo(json.dumps({"run_id": run_id, **_credit_json(report)}, indent=2))
    else:
        from cli.output import make_console

        _print_credit(make_console(), report, top, title=f"credit in run {run_id}")


def _credit_json(report: CreditReport) -> dict[str, Any]:
    return {
        "at": report.now,
        "half_life_s": report.half_life_s,
        "trusted": sorted(_base58(peer) for peer in report.trusted),
        "vouchers": {_base58(peer): budget for peer, budget in report.vouchers.items()},
        "standing": report.standing_counts(),
        "contributors": [
            {
                "peer_id": _base58(item.contributor),
                "total": item.total,
                "recent": item.recent,
                "untrusted": item.untrusted,
                "receipts": item.receipts,
                "rejected": dict(item.rejected),
                "roles": {role: credit.to_json() for role, credit in item.roles.items()},
            }
            for item in report.leaderboard()
        ],
    }


def _audit_json(report: AuditReport) -> dict[str, Any]:
    assert report.credit is not None
    return {
        "ok": report.ok,
        "run_id": report.run_id,
        "declared": report.declared,
        "valid": report.valid,
        "duplicates": report.duplicates,
        "invalid": [{"line": line, "reason": reason} for line, reason in report.invalid],
        **_credit_json(report.credit),
    }


def _print_audit(report: AuditReport, top: int) -> None:
    from cli.output import make_console

    assert report.credit is not None
    console = make_console()
    status = "[green]all receipts verify[/]" if report.ok else "[red]the export does not fully verify[/]"
    console.print(
        f"{status}: run {report.run_id}, {report.valid} valid, {len(report.invalid)} invalid, "
        f"{report.duplicates} duplicate line(s); the header declares {report.declared}"
    )
    for line, reason in report.invalid[:_MAX_SHOWN_INVALID]:
        console.print(f"  [red]line {line}[/]: {reason}", highlight=False)
    if len(report.invalid) > _MAX_SHOWN_INVALID:
        console.print(f"  ... and {len(report.invalid) - _MAX_SHOWN_INVALID} more invalid lines")
    _print_credit(console, report.credit, top, title=f"credit recomputed from {report.valid} receipts")


def _print_credit(console: Any, report: CreditReport, top: int, *, title: str) -> None:
    from rich.table import Table

    from protocol import rollout_messages

    table = Table(title=title)
    table.add_column("contributor")
    for role in _ROLES:
        table.add_column(role, justify="right")
    for column in ("total", "recent/day", "untrusted", "receipts", "rejected", "abandoned"):
        table.add_column(column, justify="right")
    board = report.leaderboard()
    for item in board[:top]:
        abandoned = item.rejected.get(rollout_messages.ABANDONED, 0)
        table.add_row(
            _base58(item.contributor),
            *(f"{item.roles[role].total:,.0f}" for role in _ROLES),
            f"{item.total:,.0f}",
            f"{item.recent:,.1f}",
            f"{item.untrusted:,.0f}" if item.untrusted else "",
            str(item.receipts),
            str(sum(item.rejected.values()) - abandoned or ""),
            str(abandoned or ""),
        )
    console.print(table)
    if len(board) > top:
        console.print(f"... and {len(board) - top} more contributors (--top N, or --json for all)")
    counts = ", ".join(f"{count} {name}" for name, count in report.standing_counts().items() if count)
    console.print(
        f"receipts: {counts or 'none'}; {len(report.trusted)} trusted signer(s), "
        f"{len(report.vouchers)} vouching signer(s) one hop away"
    )
    if not report.trusted:
        console.print(
            "[yellow]no --trainer, --validator or --trusted signer given: every receipt counts zero "
            "(shown as untrusted)[/]"
        )
