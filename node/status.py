"""Machine-readable node status: a JSON snapshot written to a file and/or served over HTTP.

Seeds and volunteers use it for health checks; the local swarm harness uses it to learn
each child node's PeerID, addresses and what it has discovered. The HTTP server also serves
the node's Prometheus metrics at /metrics (`node.metrics`); the JSON status carries the same
figures under `metrics`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from node.http_server import BoundedHTTPServer
from node.metrics import METRICS_CONTENT_TYPE, MetricsFigures, NodeMetrics
from node.own_credit import CreditFigures
from node.runtime import offload
from protocol.errors import ConfigError

logger = logging.getLogger(__name__)


class NodeStatusSnapshot(BaseModel):
    """What a running node reports about itself."""

    model_config = ConfigDict(extra="forbid")

    peer_id: str
    """Full base58 PeerID."""
    public_name: str
    """The node's public name."""
    roles: list[str]
    """The node's roles."""
    run_id: str
    """The run it takes part in."""
    multiaddrs: list[str]
    """Full multiaddrs (with /p2p/) others can dial; a seed's are what goes into --initial-peers."""
    pid: int
    """Process id of the node."""
    uptime_s: float
    """Seconds since the node started."""
    dht_peers: int
    """Peers in this node's DHT routing table."""
    live_nodes: list[str]
    """PeerIDs of the live nodes of the run it currently discovers (itself included)."""
    record_published: bool
    """Whether the last publish of its node record was accepted by the DHT."""
    state: str
    """'starting', 'running' or 'leaving'."""
    metrics: MetricsFigures = Field(default_factory=MetricsFigures)
    """The node's metrics (the figures /metrics exports)."""
    credit: CreditFigures | None = None
    """This node's credit from its ledger (`node.own_credit`); None on a node without a ledger."""


def write_status_file(path: Path, snapshot: NodeStatusSnapshot) -> None:
    """Atomically replace `path` with the snapshot (readers never see a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(snapshot.model_dump_json(indent=2))
    os.replace(tmp, path)


def read_status_file(path: Path) -> NodeStatusSnapshot | None:
    """The snapshot at `path`, or None if there is none yet."""
    try:
        return NodeStatusSnapshot.model_validate_json(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


STATUS_CONNECTION_TIMEOUT_S = 5.0
MAX_STATUS_CONNECTIONS = 16
"""Connections served at once (a scraper and a few health checks); more get 503 without a thread."""
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def _is_local_host(host: str, port: int | None) -> bool:
    return any(host in (name, f"{name}:{port}") for name in _LOCAL_HOSTS)


class StatusServer:
    """Serves the latest snapshot as JSON at http://127.0.0.1:PORT/status (and /health) and the
    node's metrics at /metrics; a runtime service.

    It listens on `host` (loopback by default). On another address /metrics answers any client, so
    that a Prometheus server elsewhere can scrape it, while /status and /health still answer local
    clients only.
    """

    name = "status"

    def __init__(self, port: int, metrics: NodeMetrics | None = None, *, host: str = "127.0.0.1"):
        self.host = host
        self.exposed = host not in ("127.0.0.1", "::1", "localhost")
        self.requested_port = port
        self.metrics = metrics or NodeMetrics()
        self.port: int | None = None
        self._snapshot: NodeStatusSnapshot | None = None
        self._server: BoundedHTTPServer | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = STATUS_CONNECTION_TIMEOUT_S  # an idle or slow client cannot hold a thread for long

            def do_GET(self) -> None:
                if self.path == "/metrics" and owner.exposed:
                    self._reply(200, METRICS_CONTENT_TYPE, owner.metrics.exposition())
                    return
                # a page on another site that rebinds its DNS name to 127.0.0.1 sends its own Host
                if not _is_local_host(self.headers.get("Host", ""), owner.port):
                    self.send_error(
                        403, "status is served to local clients only (Host must be 127.0.0.1 or localhost)"
                    )
                    return
                if self.path == "/metrics":
                    self._reply(200, METRICS_CONTENT_TYPE, owner.metrics.exposition())
                    return
                if self.path not in ("/status", "/health"):
                    self.send_error(404, "try /status, /health or /metrics")
                    return
                snapshot = owner._snapshot
                if snapshot is None:
                    self._reply(503, "application/json", json.dumps({"state": "starting"}).encode())
                    return
                live = snapshot.model_copy(update={"metrics": owner.metrics.figures()})
                self._reply(200 if snapshot.state == "running" else 503, "application/json",
                            live.model_dump_json().encode())  # fmt: skip

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    async def start(self) -> None:
        try:
            self._server = BoundedHTTPServer(
                (self.host, self.requested_port), self._handler(), max_connections=MAX_STATUS_CONNECTIONS
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the status on {self.host}:{self.requested_port} ({exc.strerror or exc}): another "
                "program (or another hivenet node) holds that port, or this machine has no such address; pick a "
                "free --status-port (0 for any) or another --metrics-host"
            ) from None
        self.port = self._server.server_address[1]
        if self.exposed:
            logger.warning(
                "metrics exposed on %s:%d/metrics: anyone who can reach that port can read them "
                "(/status and /health stay local)",
                self.host,
                self.port,
            )
        threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True).start()

    def update(self, snapshot: NodeStatusSnapshot) -> None:
        self._snapshot = snapshot

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await offload(server.shutdown)
            server.server_close()
