"""The status port (and the dashboard, on the same server class) serves a bounded number of connections:
idle sockets beyond the cap get 503 at once instead of a thread each, and the port serves again as
soon as they close."""

from __future__ import annotations

import asyncio
import http.client
import socket

from node.status import MAX_STATUS_CONNECTIONS, StatusServer
from node.swarm import wait_until


def _answered(port: int) -> bool:
    """A request reaches the handler (its 503 'starting' carries a JSON body; the cap's carries none)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/status")
        return connection.getresponse().getheader("Content-Type", "") == "application/json"
    except OSError:
        return False
    finally:
        connection.close()


def test_idle_connections_beyond_the_cap_get_503_without_a_thread() -> None:
    server = StatusServer(0)
    asyncio.run(server.start())
    assert server.port is not None
    port = server.port
    idle: list[socket.socket] = []
    try:
        # connected, sending nothing: each holds a handler (accepted in order, so these take every slot)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_STATUS_CONNECTIONS)]
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
                # answered at once, before any request: no handler (one would wait for the request line)
                assert extra.recv(64).startswith(b"HTTP/1.1 503")
        for sock in idle:
            sock.close()
        idle.clear()
        # the slots come back as the idle handlers see their clients go: the port serves again
        assert wait_until(lambda: _answered(port), timeout_s=15)
    finally:
        for sock in idle:
            sock.close()
        asyncio.run(server.stop())
