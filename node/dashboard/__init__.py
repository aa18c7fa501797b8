"""The contributor dashboard: what the swarm and its receipts ledger show, as JSON and as a web page.

Map of the package:

- `data.DashboardData`: the data layer, one JSON-able dict per panel (swarm, verification,
  weights, leaderboard, credit rules, history, training, a node's page, the receipts behind any figure),
  from discovered node records (`set_live_nodes`) and a `node.ledger.Ledger`.
- `ledger_view.LedgerView`: the current snapshot of a ledger another process keeps filling, and a
  reader that knows every peer stored so far.
- `training_view`: the training panel (loss and reward curves, tokens, outer steps, bytes per
  token), computed out of the training receipts and verdicts of the signers credit counts.
- `weights_view`: the weights panel, a page of versions at a time (paged by version, newest first).
- `snapshot`: `take_snapshot` -> `LedgerSnapshot`, one pass over the ledger (credit report and
  the panels' aggregates), shared read-only between the server's threads.
- `server.DashboardServer`: the standard library HTTP server: the page, its assets in
  `static/` (shipped as package data, no CDN), a JSON API behind every panel and server-sent
  events for live updates; local clients only unless exposed.
- `watch.SwarmWatcher`: a thread that re-reads discovery every few seconds into the data layer.
"""

from node.dashboard.data import DashboardData, parse_peer, peer_text
from node.dashboard.server import DashboardServer
from node.dashboard.watch import SwarmWatcher

__all__ = ["DashboardData", "DashboardServer", "SwarmWatcher", "parse_peer", "peer_text"]
