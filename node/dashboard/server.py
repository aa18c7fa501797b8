"""The dashboard's web server: the page, its shipped assets, a JSON API per panel and live updates.

Standard library only (`node.http_server.BoundedHTTPServer`, a capped `ThreadingHTTPServer`). Routes:

- `/` and `/node/<PeerID>`: the page (one HTML file; `app.js` draws the panels from the API);
- `/static/<name>`: the assets shipped in this package (no CDN: it works offline);
- `/api/swarm`, `/api/verification`, `/api/weights?limit=&before=`, `/api/leaderboard?limit=`, `/api/credit`,
  `/api/history`, `/api/training`, `/api/node/<PeerID>`,
  `/api/receipts?contributor=&kind=&reason=&standing=&version=&step=&limit=`,
  `/api/receipt/<id hex>` (with the signed envelope), `/api/version`;
- `/api/events`: server-sent events, one `update` event whenever the ledger grows or the swarm changes.

Bound to 127.0.0.1 it answers only requests whose Host is a local name (a page of another site
that rebinds its DNS name to 127.0.0.1 sends its own Host); `expose=True` (`--host` another
address) answers any Host. Requests are size-capped, query values are checked, and an unexpected
error answers a one-line JSON error, never a traceback.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from node.dashboard.data import MAX_LIST, DashboardData, parse_peer
from node.dashboard.weights_view import WEIGHTS_PAGE
from node.http_server import BoundedHTTPServer

logger = logging.getLogger(__name__)

MAX_TARGET_CHARS = 2048
"""Longest request target (path and query) answered."""
MAX_QUERY_VALUE_CHARS = 128
"""Longest value of one query parameter."""
MAX_INT = 1 << 62
"""Largest version or step a query may name."""
MAX_EVENT_STREAMS = 32
"""Concurrent `/api/events` clients; more are told to retry later (each holds a thread)."""
EVENT_POLL_S = 1.0
EVENT_STREAM_MAX_S = 600.0
"""An event stream ends after this long; browsers reconnect by themselves."""
CONNECTION_TIMEOUT_S = 10.0
MAX_CONNECTIONS = MAX_EVENT_STREAMS + 32
"""Connections served at once: every event stream, plus room for the page and its API calls."""
ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class ApiError(Exception):
    """A request the API refuses, with its HTTP status and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _asset(name: str) -> bytes:
    return resources.files("node.dashboard").joinpath("static", name).read_bytes()


def _query(raw: str) -> dict[str, str]:
    try:
        parsed = parse_qs(raw, strict_parsing=False, max_num_fields=16)
    except ValueError:
        raise ApiError(400, "too many query parameters") from None
    query = {}
    for key, values in parsed.items():
        if len(values) != 1 or len(values[0]) > MAX_QUERY_VALUE_CHARS:
            raise ApiError(
                400, f"query parameter {key[:32]!r} must be given once, at most {MAX_QUERY_VALUE_CHARS} chars"
            )
        query[key] = values[0]
    return query


def _known(query: dict[str, str], names: set[str]) -> None:
    unknown = set(query) - names
    if unknown:
        raise ApiError(
            400, f"unknown parameter {sorted(unknown)[0][:32]!r}; this API takes {', '.join(sorted(names))}"
        )


def _int(query: dict[str, str], key: str, default: int | None, low: int, high: int) -> int | None:
    text = query.get(key)
    if text is None:
        return default
    # int() would also take " 7", "+7", "7_0" and non-ASCII digits
    if not (text.isascii() and text.isdigit()):
        raise ApiError(400, f"{key} must be a whole number (ASCII digits), between {low} and {high}")
    value = int(text)
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be between {low} and {high}")
    return value


def _peer(text: str) -> bytes:
    try:
        return parse_peer(text)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


class DashboardServer:
    """Serves a `DashboardData` over HTTP; `start()` binds and serves on a daemon thread, `stop()` ends it."""

    def __init__(self, data: DashboardData, *, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.data = data
        self.host = host
        self.requested_port = port
        self.expose = host not in ("127.0.0.1", "localhost", "::1")
        self.port: int | None = None
        self._server: BoundedHTTPServer | None = None
        self._stopping = threading.Event()
        self._streams = threading.Semaphore(MAX_EVENT_STREAMS)
        self._routes: dict[str, Callable[[dict[str, str]], Any]] = {
            "swarm": lambda q: data.swarm(),
            "verification": lambda q: data.verification(),
            "weights": self._weights,
            "leaderboard": lambda q: data.leaderboard(_int(q, "limit", 100, 1, 500) or 100),
            "credit": lambda q: data.credit_rules(),
            "history": lambda q: data.history(),
            "training": lambda q: data.training(),
            "version": lambda q: data.version(),
            "receipts": self._receipts,
        }

    @property
    def url(self) -> str:
        host = "127.0.0.1" if not self.expose or self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/"

    def _weights(self, query: dict[str, str]) -> Any:
        _known(query, {"limit", "before"})
        return self.data.weights(
            _int(query, "limit", WEIGHTS_PAGE, 1, MAX_LIST) or WEIGHTS_PAGE,
            before=_int(query, "before", None, 0, MAX_INT),
        )

    def _receipts(self, query: dict[str, str]) -> Any:
        _known(query, {"contributor", "kind", "reason", "standing", "version", "step", "limit"})
        contributor = query.get("contributor")
        try:
            return self.data.receipts(
                contributor=_peer(contributor) if contributor else None,
                kind=query.get("kind"),
                reason=query.get("reason"),
                standing=query.get("standing"),
                version=_int(query, "version", None, 0, MAX_INT),
                step=_int(query, "step", None, 0, MAX_INT),
                limit=_int(query, "limit", 100, 1, 500) or 100,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def answer(self, path: str, query: dict[str, str]) -> Any:
        """The JSON answer for an `/api/...` path (without the prefix); ApiError if there is none."""
        name, _, rest = path.partition("/")
        if name == "node" and rest:
            found = self.data.node(_peer(rest))
            if found is None:
                raise ApiError(404, "no receipts and no live record for this peer")
            return found
        if name == "receipt" and rest:
            try:
                rid = bytes.fromhex(rest)
            except ValueError:
                raise ApiError(400, "a receipt id is 64 hex digits") from None
            if len(rid) != 32:
                raise ApiError(400, "a receipt id is 64 hex digits")
            found = self.data.receipt(rid)
            if found is None:
                raise ApiError(404, "no such receipt in this ledger")
            return found
        route = self._routes.get(path)
        if route is None:
            raise ApiError(404, "no such API; see /api/swarm, /api/leaderboard, /api/node/<PeerID>, ...")
        return route(query)

    def _local_host(self, host: str) -> bool:
        return self.expose or any(host in (name, f"{name}:{self.port}") for name in _LOCAL_HOSTS)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_S
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                try:
                    self._get()
                except ApiError as exc:
                    self._json(exc.status, {"error": str(exc)})
                except (BrokenPipeError, ConnectionResetError):
                    pass
                except Exception:
                    logger.exception("dashboard request %s failed", self.path[:200])
                    self._json(500, {"error": "internal error"})

            def _get(self) -> None:
                if not owner._local_host(self.headers.get("Host", "")):
                    raise ApiError(
                        403, "the dashboard answers local clients only (Host must be 127.0.0.1 or localhost)"
                    )
                if len(self.path) > MAX_TARGET_CHARS:
                    raise ApiError(414, "request target too long")
                target = urlsplit(self.path)
                path = target.path
                if path == "/api/events":
                    self._events()
                elif path.startswith("/api/"):
                    self._json(200, owner.answer(path[len("/api/") :], _query(target.query)))
                elif path == "/" or (path.startswith("/node/") and path.count("/") == 2):
                    self._reply(200, "text/html; charset=utf-8", _asset("index.html"))
                elif path.startswith("/static/") and path[len("/static/") :] in ASSETS:
                    name = path[len("/static/") :]
                    self._reply(200, ASSETS[name] + "; charset=utf-8", _asset(name))
                elif path == "/health":
                    self._json(200, {"ok": True})
                else:
                    raise ApiError(404, "not found")

            def _events(self) -> None:
                if not owner._streams.acquire(blocking=False):
                    raise ApiError(503, "too many live clients; retry later")
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-store")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    self.wfile.write(b"retry: 2000\n\n")
                    last = None
                    ends = time.monotonic() + EVENT_STREAM_MAX_S
                    while not owner._stopping.is_set() and time.monotonic() < ends:
                        current = owner.data.version()
                        if current != last:
                            self.wfile.write(f"event: update\ndata: {json.dumps(current)}\n\n".encode())
                            last = current
                        else:
                            self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        owner._stopping.wait(EVENT_POLL_S)
                finally:
                    owner._streams.release()

            def _json(self, status: int, body: Any) -> None:
                self._reply(status, "application/json", json.dumps(body, allow_nan=False).encode())

            def _reply(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in _SECURITY_HEADERS.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def start(self) -> None:
        server = BoundedHTTPServer(
            (self.host, self.requested_port), self._handler(), max_connections=MAX_CONNECTIONS
        )
        self._server = server
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, name="dashboard-http", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
