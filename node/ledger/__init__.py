"""The contribution ledger: verified receipts in SQLite, credit, and auditable exports.

Map of the package:

- `store.Ledger`: one run's receipts in a SQLite file (WAL); every receipt re-verified before it is
  stored; `add`, `add_many` (one transaction per batch; `AddResult`), `receipts`, `get`,
  `contributor_receipts` (one contributor's newest receipts, `ContributorReceipts`),
  `envelopes`, `page` (receipts after a position, as `StoredEnvelope`s: the exchange's cursor),
  `export` (a consistent snapshot while receipts arrive), `credit`.
- `credit`: `compute_credit` -> `CreditReport` (per contributor and role: total, recent average
  with a half-life, untrusted points; `Standing` of each receipt), `CreditRates`, the sybil rule
  (signers by role, `signers.RunSigners`; one hop of vouching for transfer and seed receipts, capped
  by what the voucher earned).
- `export`: the export format (JSON lines of base64 envelopes), `write_export`, `export_run` and `export_envelopes` (reading one back,
  e.g. to import it into a ledger), `audit_export` -> `AuditReport` (every signature re-checked, every total recomputed offline).

Receipt formats and their verification are in `protocol.receipts`.
"""

from node.ledger.credit import (
    DEFAULT_HALF_LIFE_S,
    ContributorCredit,
    CreditRates,
    CreditReport,
    RoleCredit,
    Standing,
    compute_credit,
)
from node.ledger.export import AuditReport, audit_export, export_envelopes, export_run, write_export
from node.ledger.signers import VOUCHING_ROLE, RunSigners
from node.ledger.store import AddResult, ContributorReceipts, Ledger, StoredEnvelope

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "VOUCHING_ROLE",
    "AddResult",
    "AuditReport",
    "ContributorCredit",
    "ContributorReceipts",
    "CreditRates",
    "CreditReport",
    "Ledger",
    "RoleCredit",
    "RunSigners",
    "Standing",
    "StoredEnvelope",
    "audit_export",
    "compute_credit",
    "export_envelopes",
    "export_run",
    "write_export",
]
