"""The dashboard's JSON API over HTTP, on a ledger of sealed receipts and discovered node records."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.dashboard import DashboardData, DashboardServer, peer_text
from node.ledger import Ledger
from node.swarm import wait_until
from protocol import rollouts_pb2
from protocol.node_record import Reachability
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import open_receipt
from protocol.rollout_messages import seal_verdict
from tests.helpers import receipts
from tests.helpers.dashboard import DashboardRun, build_run
from tests.helpers.dashboard_training import training_round
from tests.helpers.receipts import RUN, new_peer
from tests.helpers.rollouts import key


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[DashboardRun, DashboardData, DashboardServer]]:
    run, ledger = build_run(tmp_path / "ledger.db")
    data = DashboardData(ledger, trusted=run.trusted)
    data.set_live_nodes(run.live_nodes())
    server = DashboardServer(data, port=0)
    server.start()
    try:
        yield run, data, server
    finally:
        server.stop()
        ledger.close()


def get(server: DashboardServer, path: str, host: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}")
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            kind = response.headers["Content-Type"]
            return response.status, json.loads(body) if kind == "application/json" else body.decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def row_of(board: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in board["rows"] if row["name"] == name)


def test_swarm_counts_live_nodes_by_role(served: Any) -> None:
    run, data, server = served
    before = get(server, "/api/swarm")[1]["list"]  # no snapshot yet
    assert all(n["credit_recent"] is None and n["tokens_per_min"] is None for n in before)
    # asking for the swarm alone (no other panel) has the snapshot made for the next ask
    assert wait_until(lambda: get(server, "/api/swarm")[1]["list"][0]["credit_recent"] is not None, 30.0)
    status, swarm = get(server, "/api/swarm")
    assert status == 200
    assert swarm["connected"] is True and swarm["nodes"] == len(run.peers)
    assert swarm["by_role"] == {"inference": 3, "trainer": 2, "validator": 2}
    assert {n["name"] for n in swarm["list"]} == set(run.peers)
    assert all(n["online_s"] >= 600 for n in swarm["list"])
    assert all(n["label"] == n["name"] for n in swarm["list"])
    assert all(5 <= n["last_seen_s"] < 600 for n in swarm["list"])  # from when each record was signed
    credit = data.view.read(lambda ledger: ledger.credit(trusted=run.trusted).contributors)
    for row in swarm["list"]:
        peer = run.peers[row["name"]].peer_id
        assert row["credit_recent"] == pytest.approx(credit[peer].recent if peer in credit else 0.0, rel=1e-3)
    assert any(row["credit_recent"] > 0 for row in swarm["list"])
    # the validators' accepted verdicts (policy version 3); only mallory's is of the last ten minutes
    by_name = {row["name"]: row for row in swarm["list"]}
    assert {name: row["policy_version"] for name, row in by_name.items()} == {
        **dict.fromkeys(("val-a", "val-b", "trainer-a", "trainer-b")),
        **dict.fromkeys(("alice", "bob", "mallory"), 3),
    }
    assert by_name["mallory"]["tokens_per_min"] == pytest.approx(30 / 10)
    assert all(row["tokens_per_min"] == 0.0 for name, row in by_name.items() if name != "mallory")
    assert all(row["reachability"] == "unknown" for row in swarm["list"])  # no record reports a check


def test_a_node_without_a_public_name_is_labelled_by_its_role(served: Any) -> None:
    """The seed used to show with an empty name."""
    run, data, server = served
    nodes = run.live_nodes()
    seed = new_peer()[1]
    nameless = dataclasses.replace(
        nodes[0], record=nodes[0].record.model_copy(update={"public_name": "", "peer_id": seed})
    )
    data.set_live_nodes([nameless, *nodes])
    row = next(n for n in get(server, "/api/swarm")[1]["list"] if n["peer_id"] == peer_text(seed))
    assert row["name"] == ""
    assert row["label"] == f"{nameless.record.roles[0].value} {row['peer_id'][-8:]}"


def test_the_swarm_lists_what_each_record_says_of_its_reachability(served: Any) -> None:
    run, data, server = served
    public, private, *rest = run.live_nodes()
    data.set_live_nodes(
        [
            dataclasses.replace(public, record=public.record.model_copy(update={"reachability": Reachability.PUBLIC})),
            dataclasses.replace(private, record=private.record.model_copy(update={"reachability": Reachability.PRIVATE})),
            *rest,
        ]
    )  # fmt: skip
    rows = {row["peer_id"]: row["reachability"] for row in get(server, "/api/swarm")[1]["list"]}
    assert rows[peer_text(public.record.peer_id)] == "public"
    assert rows[peer_text(private.record.peer_id)] == "private"
    assert {rows[peer_text(n.record.peer_id)] for n in rest} == {"unknown"}


def test_leaderboard_credit_matches_the_receipts(served: Any) -> None:
    run, _, server = served
    _, board = get(server, "/api/leaderboard")
    assert board["receipts"] == 11
    assert row_of(board, "alice")["roles"]["inference"] == run.worker_tokens["alice"] == 200
    assert row_of(board, "mallory")["total"] == run.worker_tokens["mallory"] == 30
    # trainer-a: 1000 tokens trained (trusted signer) + 1 MiB delivered to alice, vouched by alice's credit
    trainer = row_of(board, "trainer-a")
    assert trainer["roles"] == {"inference": 0, "trainer": 1000, "broadcast": 100, "seed": 0, "validator": 0}
    assert board["rows"][0]["name"] == "trainer-a"
    bob = row_of(board, "bob")
    assert bob["total"] == 50 and bob["untrusted"] == 400  # a transfer receipt from an unknown signer
    assert all(row["recent"] > 0 for row in board["rows"] if row["total"])
    # the figure links to the receipts behind it
    _, listed = get(server, alice_url := row_of(board, "alice")["receipts_url"])
    assert alice_url.startswith("/api/receipts?contributor=")
    assert {r["contributor"] for r in listed["receipts"]} == {peer_text(run.peers["alice"].peer_id)}
    assert sum(r["counted"] for r in listed["receipts"]) == 200


def test_verification_counts_rejections_by_reason_with_their_receipts(served: Any) -> None:
    run, _, server = served
    _, verification = get(server, "/api/verification")
    assert verification["accepted"] == 4 and verification["rejected"] == 3
    by_reason = {r["reason"]: r for r in verification["by_reason"]}
    assert {k: v["count"] for k, v in by_reason.items()} == {"toploc_mantissa": 2, "stale": 1}
    _, listed = get(server, by_reason["stale"]["receipts_url"])
    assert [r["reason"] for r in listed["receipts"]] == ["stale"]
    assert listed["receipts"][0]["contributor"] == peer_text(run.peers["mallory"].peer_id)
    assert [p["name"] for p in verification["rejected_peers"]] == ["mallory"]
    assert sum(verification["history"]["rejections"]) == 3


def test_node_page_explains_rejections(served: Any) -> None:
    run, _, server = served
    mallory = peer_text(run.peers["mallory"].peer_id)
    status, page = get(server, f"/api/node/{mallory}")
    assert status == 200
    assert page["name"] == "mallory" and page["live"] is True and page["roles"] == ["inference"]
    assert page["credit"]["total"] == 30 and page["receipts"] == 4
    assert {r["reason"]: r["count"] for r in page["rejections"]["by_reason"]} == {
        "toploc_mantissa": 2,
        "stale": 1,
    }
    assert [r["reason"] for r in page["rejections"]["latest"]] == [
        "stale",
        "toploc_mantissa",
        "toploc_mantissa",
    ]
    assert page["history"]["cumulative_credit"][-1] == 30


def test_a_listed_receipt_returns_its_signed_envelope(served: Any) -> None:
    _, _, server = served
    _, listed = get(server, "/api/receipts?kind=training")
    assert listed["matched"] == 2
    _, receipt = get(server, listed["receipts"][0]["url"])
    opened = open_receipt(base64.b64decode(receipt["envelope"]), run_id=RUN)
    assert opened.receipt_id.hex() == receipt["id"] and opened.tokens == 1000


def test_weights_versions_from_transfer_receipts(served: Any) -> None:
    _, _, server = served
    _, weights = get(server, "/api/weights")
    assert [v["version"] for v in weights["versions"]] == [2]
    assert weights["versions"][0]["receipts"] == 2 and weights["versions"][0]["bytes"] == 5 << 20


def test_credit_rules_show_trust_and_standing(served: Any) -> None:
    run, _, server = served
    _, rules = get(server, "/api/credit")
    assert {p["name"] for p in rules["trusted"]} == {"val-a", "val-b", "trainer-a", "trainer-b"}
    assert {p["name"]: p["budget"] for p in rules["vouchers"]} == {"alice": 200, "bob": 50, "mallory": 30}
    assert rules["standing"]["untrusted"]["count"] == 1 and rules["standing"]["rejected"]["count"] == 3
    _, untrusted = get(server, rules["standing"]["untrusted"]["receipts_url"])
    assert [r["contributor"] for r in untrusted["receipts"]] == [peer_text(run.peers["bob"].peer_id)]


def test_new_receipts_show_at_once(served: Any) -> None:
    run, data, server = served
    before = data.version()
    data.ledger.add(run.verdict("val-a", "bob", tokens=25))
    # the ledger is re-counted at most every count_ttl_s
    assert wait_until(lambda: data.version()["receipts"] == before["receipts"] + 1, timeout_s=10)
    _, board = get(server, "/api/leaderboard")
    assert row_of(board, "bob")["total"] == 75


def test_a_standalone_validators_credit_shows_in_the_validator_role(served: Any) -> None:
    run, data, server = served
    before = data.version()
    # trainer-a took a group val-b forwarded (counts); mallory, a worker with credit, vouches for
    # no validation: its receipt counts zero
    data.ledger.add(receipts.validation(run.peers["trainer-a"].key, run.peers["val-b"].peer_id, tokens=400))
    data.ledger.add(receipts.validation(run.peers["mallory"].key, run.peers["val-b"].peer_id, tokens=400))
    assert wait_until(lambda: data.version()["receipts"] == before["receipts"] + 2, timeout_s=10)
    _, board = get(server, "/api/leaderboard")
    assert "validator" in board["points"] and "0.25 per token" in board["points"]["validator"]
    assert all(
        set(row["roles"]) == {"inference", "trainer", "broadcast", "seed", "validator"}
        for row in board["rows"]
    )
    validator = row_of(board, "val-b")
    assert validator["roles"]["validator"] == validator["total"] == 100
    assert validator["untrusted"] == 100 and validator["receipts"] == 2
    _, listed = get(server, validator["receipts_url"])
    assert {r["kind"] for r in listed["receipts"]} == {"validation"}
    assert {r["role"] for r in listed["receipts"]} == {"validator"}


def test_events_stream_sends_the_ledger_version(served: Any) -> None:
    _, _, server = served
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/events", timeout=10) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        lines = [stream.readline().decode().strip() for _ in range(4)]
    assert "event: update" in lines
    data = json.loads(next(line for line in lines if line.startswith("data: "))[len("data: ") :])
    assert data["receipts"] == 11


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/node/not-a-peer", 400),
        ("/api/node/" + peer_text(peer_id_from_private_key(key("unknown node"))), 404),
        ("/api/receipts?kind=bogus", 400),
        ("/api/receipts?limit=100000", 400),
        ("/api/receipts?limit=ten", 400),
        ("/api/receipts?reason=" + "x" * 500, 400),
        ("/api/receipts?evil=1", 400),
        ("/api/receipts?kind=rollout&kind=seed", 400),
        ("/api/receipts?step=1", 400),
        ("/api/receipts?kind=seed&step=1", 400),
        ("/api/receipts?kind=training&step=-1", 400),
        ("/api/receipt/zz", 400),
        ("/api/receipt/" + "00" * 32, 404),
        ("/api/nothing", 404),
        ("/static/../data.py", 404),
        ("/" + "a" * 3000, 414),
    ],
)
def test_bad_requests_get_a_json_error_without_a_traceback(served: Any, path: str, status: int) -> None:
    _, _, server = served
    got, body = get(server, path)
    assert got == status
    assert set(body) == {"error"} and "Traceback" not in body["error"]


def test_an_internal_error_answers_500_without_a_traceback(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, data, server = served

    def broken() -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(data, "weights", broken)
    status, body = get(server, "/api/weights")
    assert status == 500 and body == {"error": "internal error"}


def test_other_hosts_are_refused_unless_exposed(served: Any) -> None:
    _, data, server = served
    assert get(server, "/api/swarm", host="evil.example")[0] == 403
    assert get(server, "/api/swarm", host=f"localhost:{server.port}")[0] == 200
    exposed = DashboardServer(data, host="0.0.0.0", port=0)
    exposed.start()
    try:
        assert get(exposed, "/api/swarm", host="dashboard.example")[0] == 200
    finally:
        exposed.stop()


def test_training_panel_from_the_receipts_with_each_point_behind_a_link(served: Any) -> None:
    run, data, server = served
    status, panel = get(server, "/api/training")
    # the run's two training receipts (outer step 5, sealed without a loss) and its accepted verdicts
    assert status == 200 and (panel["outer_steps"], panel["latest_step"]) == (1, 5)
    assert (panel["tokens_trained"], panel["bytes_exchanged"], panel["bytes_per_token"]) == (
        2000,
        8192,
        4.096,
    )
    assert panel["loss"] == []  # no signer reported a loss
    accepted = get(server, "/api/verification")[1]["accepted"]
    assert accepted == 4 and [(p["version"], p["reward"], p["rollouts"]) for p in panel["reward"]] == [
        (3, 0.5, 4)
    ]
    trainers = {
        run.peers[n].peer_id: (run.peers[n].key, loss) for n, loss in (("trainer-a", 2.0), ("trainer-b", 3.0))
    }
    before = data.version()["receipts"]
    assert data.ledger.add_many(training_round(trainers, step=6)).added == 2
    assert wait_until(
        lambda: data.version()["receipts"] == before + 2, timeout_s=10
    )  # counted every count_ttl_s
    _, panel = get(server, "/api/training")
    assert panel["outer_steps"] == 2 and [(p["step"], p["loss"]) for p in panel["loss"]] == [(6, 2.5)]
    status, behind = get(server, panel["loss"][0]["receipts_url"])
    assert status == 200 and behind["matched"] == 2
    assert {(r["kind"], r["step"]) for r in behind["receipts"]} == {("training", 6)}
    status, rewards = get(server, panel["reward"][0]["receipts_url"])
    assert status == 200 and rewards["matched"] == panel["reward"][0]["rollouts"]
    assert {(r["kind"], r["step"], r["accepted"]) for r in rewards["receipts"]} == {("rollout", 3, True)}


def test_the_page_and_its_assets_are_served(served: Any) -> None:
    run, _, server = served
    status, html = get(server, "/")
    assert status == 200 and "/static/app.js" in html and "http" not in html.replace("http-equiv", "")
    assert get(server, f"/node/{peer_text(run.peers['alice'].peer_id)}") == (200, html)
    status, script = get(server, "/static/app.js")
    assert status == 200 and "EventSource" in script


def test_without_discovery_the_swarm_says_so(tmp_path: Path) -> None:
    run, ledger = build_run(tmp_path / "ledger.db")
    data = DashboardData(ledger, trusted=run.trusted)
    swarm = data.swarm()
    assert swarm["connected"] is False and swarm["nodes"] == 0
    board = data.leaderboard()
    assert row_of(board, "")["total"] >= 0  # nodes never discovered have no name, but still rank
    assert data.snapshot() is data.snapshot()  # cached while the ledger does not change
    ledger.close()


def test_snapshot_is_recomputed_when_it_ages(tmp_path: Path) -> None:
    run, ledger = build_run(tmp_path / "ledger.db")
    clock = [time.time()]
    data = DashboardData(ledger, trusted=run.trusted, max_age_s=30.0, clock=lambda: clock[0])
    first = data.snapshot()
    clock[0] += 10
    assert data.snapshot() is first
    clock[0] += 25
    assert data.snapshot() is first  # served at once while the next one is computed in the background
    assert wait_until(lambda: data.snapshot() is not first, timeout_s=30)
    later = data.snapshot()
    assert later.report.now == clock[0]
    alice = run.peers["alice"].peer_id
    assert later.report.contributors[alice].recent < first.report.contributors[alice].recent
    ledger.close()


def test_a_snapshot_that_takes_long_to_compute_ages_longer(tmp_path: Path) -> None:
    """At a million receipts a snapshot takes tens of seconds of CPU: it is not recomputed every `max_age_s`."""
    run, ledger = build_run(tmp_path / "ledger.db")
    clock = [time.time()]
    data = DashboardData(ledger, trusted=run.trusted, max_age_s=30.0, clock=lambda: clock[0])
    first = data.snapshot()
    data.view._compute_s = 20.0  # what the last computation took
    assert data.view.max_age() == 80.0
    clock[0] += 35
    assert data.snapshot() is first
    assert not data.view._snapshot_lock.locked()  # no refresh was started
    clock[0] += 50
    assert data.snapshot() is first
    assert wait_until(lambda: data.snapshot() is not first, timeout_s=30)
    ledger.close()


def test_a_large_ledger_that_grows_keeps_serving_its_snapshot_while_the_next_is_computed(
    tmp_path: Path,
) -> None:
    """At a million receipts a snapshot takes tens of seconds: a page load after new receipts does not
    wait for it (it did, so in a live swarm every page load took that long)."""
    run, ledger = build_run(tmp_path / "ledger.db")
    clock = [time.time()]
    data = DashboardData(ledger, trusted=run.trusted, count_ttl_s=0.0, clock=lambda: clock[0])
    first = data.snapshot()
    data.view._compute_s = 5.0  # what the last computation took
    ledger.add(run.verdict("val-a", "bob", tokens=25))
    assert data.snapshot() is first  # served at once, and no refresh yet: 5 s of CPU at most every 20 s
    assert not data.view._snapshot_lock.locked()
    assert data.version()["receipts"] == first.count  # the panels would still show the old snapshot
    clock[0] += 20
    assert data.snapshot() is first  # the next one is computed in the background
    assert wait_until(lambda: data.snapshot() is not first, timeout_s=30)
    assert data.version()["receipts"] == first.count + 1
    bob = run.peers["bob"].peer_id
    assert data.snapshot().report.contributors[bob].total == first.report.contributors[bob].total + 25
    ledger.close()


def test_receipts_stored_by_another_writer_are_shown(served: Any) -> None:
    """The node filling the ledger is another process: its new peers are unknown to the dashboard's open ledger."""
    run, data, server = served
    _, newcomer = receipts.new_peer()
    data.snapshot()
    with Ledger(data.ledger.path) as writer:  # a second connection, as another process would hold
        writer.add(receipts.verdict(run.peers["val-a"].key, newcomer, tokens=77))
    assert wait_until(lambda: get(server, f"/api/node/{peer_text(newcomer)}")[0] == 200, timeout_s=10)
    _, page = get(server, f"/api/node/{peer_text(newcomer)}")
    assert page["credit"]["total"] == 77
    _, board = get(server, "/api/leaderboard")
    assert any(row["peer_id"] == peer_text(newcomer) and row["total"] == 77 for row in board["rows"])


def test_node_page_shows_the_validators_detail_of_a_rejection(served: Any) -> None:
    run, data, server = served
    _, cheater = receipts.new_peer()
    verdict = rollouts_pb2.RolloutVerdict(
        worker=cheater, rollout_hash=os.urandom(32), policy_version=3, tokens=64, accepted=False,
        reason="toploc_mantissa", detail="mantissa mismatch in chunk 2", issued_at=time.time(),
    )  # fmt: skip
    data.ledger.add(seal_verdict(run.peers["val-b"].key, run_id=RUN, verdict=verdict))
    assert wait_until(lambda: get(server, f"/api/node/{peer_text(cheater)}")[0] == 200, timeout_s=10)
    _, page = get(server, f"/api/node/{peer_text(cheater)}")
    [rejection] = page["rejections"]["latest"]
    assert rejection["reason"] == "toploc_mantissa" and rejection["detail"] == "mantissa mismatch in chunk 2"
    assert rejection["signer"] == peer_text(run.peers["val-b"].peer_id)


def test_banned_peers_are_read_from_the_trusted_validators_verdicts(served: Any) -> None:
    run, data, server = served
    _, cheater = receipts.new_peer()
    _, slandered = receipts.new_peer()
    now = time.time()

    def banning(validator: Any, worker: bytes, until: float) -> bytes:
        verdict = rollouts_pb2.RolloutVerdict(
            worker=worker, rollout_hash=os.urandom(32), policy_version=3, tokens=64, accepted=False,
            reason="sampling", detail="token 5 was not sampled", issued_at=now, banned_until=until,
        )  # fmt: skip
        return seal_verdict(validator, run_id=RUN, verdict=verdict)

    sybil, _ = receipts.new_peer()  # a "validator" the run does not trust
    data.ledger.add(banning(run.peers["val-a"].key, cheater, now + 600))
    data.ledger.add(banning(sybil, slandered, now + 600))
    _, verification = get(server, "/api/verification")
    [row] = verification["banned"]
    assert row["peer_id"] == peer_text(cheater) and row["bans"] == 1 and row["active"] is True
    assert row["banned_until"] == pytest.approx(now + 600) and row["validators"] == 1
    [reason] = row["reasons"]
    _, listed = get(server, reason["receipts_url"])  # the figure links to the verdict behind it
    assert [(r["contributor"], r["reason"]) for r in listed["receipts"]] == [(peer_text(cheater), "sampling")]


def test_a_node_page_credits_receipts_stored_since_the_last_snapshot(tmp_path: Path) -> None:
    """The page lists a node's receipts from the ledger and its credit from the snapshot: a receipt
    stored in between was listed with no credit (0 instead of 77) until the ledger was counted again."""
    run, ledger = build_run(tmp_path / "ledger.db")
    data = DashboardData(ledger, trusted=run.trusted, count_ttl_s=3600.0)
    _, newcomer = receipts.new_peer()
    data.snapshot()
    with Ledger(ledger.path) as writer:  # another process, as a node filling the ledger would be
        writer.add(receipts.verdict(run.peers["val-a"].key, newcomer, tokens=77))
    page = data.node(newcomer)
    assert page is not None and page["credit"]["total"] == 77
    ledger.close()


def test_the_weights_panel_lists_the_newest_versions_and_says_how_many_there_are(served: Any) -> None:
    run, data, server = served
    sources = [run.peers["trainer-a"], run.peers["trainer-b"]]
    data.view.ledger.add_many(
        [receipts.transfer(sources[v % 2].key, run.peers["alice"].peer_id, version=v) for v in range(1, 31)]
    )
    _, weights = get(server, "/api/weights?limit=5")
    assert weights["total"] >= 30 and [v["version"] for v in weights["versions"]] == [30, 29, 28, 27, 26]
    assert len(get(server, "/api/weights")[1]["versions"]) == 20  # the panel's page
    assert get(server, "/api/weights?limit=0")[0] == 400


def test_the_weights_panel_pages_through_every_version_once_in_order(served: Any) -> None:
    """The panel listed the newest 20 versions and no way to the older ones."""
    run, data, server = served
    sources = [run.peers["trainer-a"], run.peers["trainer-b"]]
    data.view.ledger.add_many(
        [receipts.transfer(sources[v % 2].key, run.peers["alice"].peer_id, version=v) for v in range(1, 46)]
    )
    pages: list[dict[str, Any]] = []
    url: str | None = "/api/weights?limit=7"
    while url is not None:
        status, page = get(server, url)
        assert status == 200 and page["total"] == 45
        assert page["offset"] == sum(len(p["versions"]) for p in pages)
        pages.append(page)
        url = page["older_url"]
    listed = [v["version"] for p in pages for v in p["versions"]]
    assert listed == list(range(45, 0, -1)) and len(pages) == 7
    back = [pages[-1]]
    while back[-1]["newer_url"] is not None:  # and the newer links walk the same pages back
        back.append(get(server, back[-1]["newer_url"])[1])
    assert [p["versions"] for p in back] == [p["versions"] for p in pages[::-1]]
    # a page stays put as new versions arrive (the page redraws on each): it is a version, not an offset
    before = pages[1]["older_url"]
    data.view.ledger.add(receipts.transfer(sources[0].key, run.peers["alice"].peer_id, version=46))
    data.view.snapshot(fresh=True)
    _, again = get(server, before)
    assert again["versions"] == pages[2]["versions"] and (again["total"], again["offset"]) == (46, 15)


@pytest.mark.parametrize(
    "query",
    [
        "before=-1",
        "before=ten",
        "before=1.5",
        "before=%2B5",  # +5
        "before=%205",  # " 5"
        "before=1_0",
        "before=%D9%A3",  # an Arabic-Indic 3
        f"before={(1 << 62) + 1}",
        "before=1&before=2",
        "page=2",
        "offset=20",
        "limit=501",  # the page size is capped
        "limit=0",
    ],
)
def test_bad_weights_paging_parameters_get_a_400_that_names_them(served: Any, query: str) -> None:
    _, _, server = served
    status, body = get(server, "/api/weights?" + query)
    assert status == 400 and set(body) == {"error"}, (status, body)
    assert query.split("=")[0] in body["error"] and "Traceback" not in body["error"], body
