"""Two real nodes in one process: each serves its own /metrics, and the counters follow the events.

A publisher and a fetcher (each a `HivenetNode` with a status port) run the weight broadcast
with their node's metrics; the publisher's /metrics must show the chunks it served, the
fetcher's the chunks it fetched, both the live peers by role, and the JSON status the same.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.contribution import contribution_line
from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.config import load_config
from node.dashboard import DashboardData, peer_text
from node.ledger import RunSigners
from node.node import HivenetNode
from node.swarm import wait_until
from tests.helpers import receipts
from tests.helpers.broadcast import TEST_CHUNK_BYTES, make_state_dict
from tests.helpers.receipts import new_peer

RUN = "metrics-run"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[HivenetNode, HivenetNode]]:
    started: list[HivenetNode] = []
    try:
        for name, role in (("publisher", "trainer"), ("fetcher", "validator")):
            config = load_config(
                identity_path=tmp_path / f"{name}.key",
                weights_dir=tmp_path / f"{name}-weights",
                ledger_path=tmp_path / f"{name}.ledger.db",
                host="127.0.0.1",
                run_id=RUN,
                roles=[role],
                public_name=name,
                status_port=_free_port(),
                initial_peers=started[0].multiaddrs() if started else [],
                bootstrap_timeout_s=30,
            )
            node = HivenetNode(config)
            node.start()
            started.append(node)
        yield started[0], started[1]
    finally:
        for node in reversed(started):
            node.stop()


def _broadcast(node: HivenetNode, publisher: HivenetNode) -> WeightBroadcast:
    assert node.dht is not None
    config = BroadcastConfig(
        store_dir=node.config.weights_dir,
        authorized_publishers=[publisher.identity.peer_id.to_base58()],
        chunk_bytes=TEST_CHUNK_BYTES,
        holder_refresh_s=0.5,
        request_timeout_s=10.0,
    )
    return node.add_service(
        WeightBroadcast(dht=node.dht, identity=node.identity, config=config, metrics=node.metrics)
    )


def test_each_node_serves_its_own_metrics_and_they_follow_the_events(
    two_nodes: tuple[HivenetNode, HivenetNode],
) -> None:
    publisher, fetcher = two_nodes
    assert publisher.config.status_port is not None and fetcher.config.status_port is not None
    pub_port, fetch_port = publisher.config.status_port, fetcher.config.status_port
    assert _scrape(pub_port)[("hivenet_chunks_served_total", ())] == 0

    served, fetching = _broadcast(publisher, publisher), _broadcast(fetcher, publisher)
    manifest = publisher.call(
        served.publish(RUN, 1, make_state_dict(seed=5, total_floats=40_000)), timeout_s=60
    )
    fetcher.call(fetching.fetch(RUN), timeout_s=120)

    # the publisher counts a chunk once its upload is written out
    assert wait_until(lambda: publisher.metrics.figures().chunks_served >= manifest.num_chunks, 10.0)

    def both_see_both() -> bool:
        for node in (publisher, fetcher):
            node.refresh_view()
        return all(len(node.live_nodes) == 2 for node in (publisher, fetcher))

    assert wait_until(both_see_both, timeout_s=30, interval_s=0.5)

    at_publisher, at_fetcher = _scrape(pub_port), _scrape(fetch_port)
    assert at_publisher[("hivenet_chunks_served_total", ())] == manifest.num_chunks
    assert at_publisher[("hivenet_chunks_fetched_total", ())] == 0
    assert at_fetcher[("hivenet_chunks_fetched_total", ())] == manifest.num_chunks
    assert at_fetcher[("hivenet_bytes_received_total", (("channel", "broadcast"),))] >= manifest.total_bytes
    for scraped in (at_publisher, at_fetcher):
        assert scraped[("hivenet_live_peers", (("role", "trainer"),))] == 1
        assert scraped[("hivenet_live_peers", (("role", "validator"),))] == 1

    figures = _status(fetch_port)["metrics"]
    assert figures["chunks_fetched"] == manifest.num_chunks
    assert figures["live_peers"] == {"trainer": 1, "validator": 1}


def test_the_contribution_line_status_metrics_and_dashboard_show_one_credit(
    two_nodes: tuple[HivenetNode, HivenetNode],
) -> None:
    """The terminal, /status and /metrics each counted credit their own way and contradicted the
    dashboard (issue 28); now they show the one figure a dashboard over the node's ledger shows."""
    publisher, _ = two_nodes
    assert publisher.ledger is not None and publisher.config.status_port is not None
    validator_key, validator = new_peer()
    sybil_key, _ = new_peer()
    me = publisher.identity.peer_id_bytes
    publisher.ledger.add_many(
        [
            *(receipts.verdict(validator_key, me, tokens=30, run_id=RUN) for _ in range(3)),
            receipts.verdict(
                validator_key, me, tokens=30, accepted=False, reason="toploc_mantissa", run_id=RUN
            ),
            receipts.verdict(sybil_key, me, tokens=50, run_id=RUN),
        ]
    )
    signers = RunSigners(validators=frozenset({validator}))
    publisher.own_credit.signers = signers
    publisher.own_credit.max_age_s = 0.0  # counted afresh on every status write
    publisher.refresh_view()

    credit = publisher.own_credit.figures()
    assert credit is not None and credit.total == 90 and credit.untrusted == 50
    line = contribution_line(publisher.metrics.figures(), credit)
    status = _status(publisher.config.status_port)
    scraped = _scrape(publisher.config.status_port)
    board = DashboardData(publisher.ledger, trusted=signers).leaderboard()
    [row] = [r for r in board["rows"] if r["peer_id"] == peer_text(me)]
    assert f"credit {row['total']:,.0f} " in line and "50 from untrusted signers" in line
    assert (
        status["credit"]["total"] == row["total"] == scraped[("hivenet_credit_points", (("kind", "total"),))]
    )
    assert status["credit"]["untrusted"] == row["untrusted"] == status["metrics"]["credit"]["untrusted"]
    assert status["credit"]["recent"] == pytest.approx(row["recent"], rel=1e-3)
