"""The receipts exchange: every node keeps a ledger of receipts and peers pull them from each other.

Map of the package:

- `exchange.ReceiptExchange`: the runtime service: the node's own receipts into its ledger
  (`record`, `store`), the ledger served to peers, and bounded pull cycles over the run's live nodes.
- `server.ReceiptServer`: serves a ledger on `PROTO_RECEIPTS`, page by page after a cursor (capped,
  timed-out streams, per-peer and total stream caps, bans).
- `client.pull_receipts` -> `PullResult`: pulls a peer's receipts into a ledger, every one
  re-verified; a peer that serves an invalid receipt or a malformed or oversized frame is banned.
- `quota.SignerQuota`: at most so many new receipts of one signer stored from pulls per window.
- `seeds`: the receipts a node signs for the seeds that served it (bootstrap, dial-back).
- `config.ReceiptsConfig`: the limits and the pull schedule.

The messages are `protocol/receipts_exchange.proto`; the receipts themselves `protocol.receipts`.
"""

from node.receipts.client import PullResult, check_page, pull_receipts
from node.receipts.config import ReceiptsConfig
from node.receipts.exchange import ReceiptExchange
from node.receipts.quota import SignerQuota
from node.receipts.seeds import bootstrap_receipts, dial_back_receipt
from node.receipts.server import PROTO_RECEIPTS, ReceiptServer, parse_receipts_request, receipts_response

__all__ = [
    "PROTO_RECEIPTS",
    "PullResult",
    "ReceiptExchange",
    "ReceiptServer",
    "ReceiptsConfig",
    "SignerQuota",
    "bootstrap_receipts",
    "check_page",
    "dial_back_receipt",
    "parse_receipts_request",
    "pull_receipts",
    "receipts_response",
]
