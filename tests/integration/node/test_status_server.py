"""The status HTTP server: JSON for local clients, nothing for rebound hosts, no idle connection kept."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from node.identity import load_identity
from node.status import STATUS_CONNECTION_TIMEOUT_S, NodeStatusSnapshot, StatusServer
from protocol.errors import ConfigError
from tests.helpers.ports import held_port


def _started() -> StatusServer:
    server = StatusServer(0)
    asyncio.run(server.start())
    server.update(
        NodeStatusSnapshot(
            peer_id="p",
            public_name="n",
            roles=["validator"],
            run_id="r",
            multiaddrs=[],
            pid=1,
            uptime_s=1.0,
            dht_peers=0,
            live_nodes=[],
            record_published=True,
            state="running",
        )
    )
    return server


def _get(port: int, host: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("GET", "/status", skip_host=True)
    connection.putheader("Host", host)
    connection.endheaders()
    response = connection.getresponse()
    return response.status, response.read()


def test_local_clients_get_the_status_and_rebound_hosts_do_not() -> None:
    server = _started()
    try:
        assert server.port is not None
        status, body = _get(server.port, f"127.0.0.1:{server.port}")
        assert status == 200 and json.loads(body)["state"] == "running"
        assert _get(server.port, "localhost")[0] == 200
        status, body = _get(server.port, "attacker.example")
        assert status == 403 and b"running" not in body
    finally:
        asyncio.run(server.stop())


def test_an_idle_connection_is_closed_by_the_server() -> None:
    server = _started()
    try:
        assert server.port is not None
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            idle.settimeout(STATUS_CONNECTION_TIMEOUT_S * 6)
            assert idle.recv(1) == b""  # closed by the server, not by our own timeout
    finally:
        asyncio.run(server.stop())


def test_a_status_port_in_use_is_one_clear_error_and_the_node_releases_what_it_took(tmp_path: Path) -> None:
    with held_port() as port:
        with pytest.raises(ConfigError, match=rf"127.0.0.1:{port} .*pick a free --status-port"):
            asyncio.run(StatusServer(port).start())
        args = ["join", "--new-swarm", "--identity", str(tmp_path / "k.key"), "--host", "127.0.0.1"]
        result = CliRunner().invoke(cli, [*args, "--status-port", str(port)])
        assert result.exit_code == 1 and "pick a free --status-port" in result.output
        assert "Traceback" not in result.output
        # the key was unlocked on the way out: the same node can start once the port is free
        key = load_identity(tmp_path / "k.key")
        key.lock()
        key.unlock()
