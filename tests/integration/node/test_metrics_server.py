"""The status server serves a node's metrics over HTTP, to local hosts only."""

from __future__ import annotations

import asyncio
import http.client
import json

from node.metrics import NodeMetrics
from node.status import NodeStatusSnapshot, StatusServer
from tests.helpers.metrics import samples


def test_the_status_server_serves_metrics_and_the_json_status_carries_them() -> None:
    metrics = NodeMetrics()
    server = StatusServer(0, metrics)
    asyncio.run(server.start())
    try:
        assert server.port is not None
        local = f"127.0.0.1:{server.port}"
        server.update(
            NodeStatusSnapshot(
                peer_id="p", public_name="n", roles=["trainer"], run_id="r", multiaddrs=[], pid=1,
                uptime_s=1.0, dht_peers=0, live_nodes=[], record_published=True, state="running",
            )
        )  # fmt: skip
        status, content_type, body = _get(server.port, "/metrics", local)
        assert status == 200 and content_type.startswith("text/plain")
        assert samples(body.decode())[("hivenet_outer_steps_total", ())] == 0

        metrics.outer_step_done(train_loss=3.0, tokens_trained=512, averaging_bytes_sent=64)
        metrics.chunk_fetched()
        parsed = samples(_get(server.port, "/metrics", local)[2].decode())
        assert parsed[("hivenet_outer_steps_total", ())] == 1
        assert parsed[("hivenet_chunks_fetched_total", ())] == 1
        assert parsed[("hivenet_tokens_total", (("role", "trainer"),))] == 512

        status, _, body = _get(server.port, "/status", local)
        assert status == 200
        figures = json.loads(body)["metrics"]
        assert figures["outer_steps"] == 1 and figures["train_loss"] == 3.0 and figures["chunks_fetched"] == 1

        status, _, body = _get(server.port, "/metrics", "attacker.example")  # DNS rebinding
        assert status == 403 and b"hivenet_" not in body
    finally:
        asyncio.run(server.stop())


def _get(port: int, path: str, host: str) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("GET", path, skip_host=True)
    connection.putheader("Host", host)
    connection.endheaders()
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type", ""), response.read()


def test_on_another_address_metrics_answer_any_scraper_and_the_status_stays_local(caplog) -> None:
    """`--metrics-host 0.0.0.0`: a Prometheus server elsewhere (its own Host header) scrapes /metrics,
    with a warning that they are exposed; /status and /health still refuse it."""
    import logging

    server = StatusServer(0, NodeMetrics(), host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="node.status"):
        asyncio.run(server.start())
    try:
        assert server.port is not None
        assert any("metrics exposed on 0.0.0.0" in r.getMessage() for r in caplog.records)
        scraper = f"10.0.0.9:{server.port}"
        status, _, body = _get(server.port, "/metrics", scraper)
        assert status == 200 and b"hivenet_" in body
        for path in ("/status", "/health"):
            assert _get(server.port, path, scraper)[0] == 403
    finally:
        asyncio.run(server.stop())
