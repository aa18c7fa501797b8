"""Node metrics: the Prometheus exposition parses, counters move with the events, nodes do not share them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.bans import BanList
from node.metrics import NodeMetrics, ban_category
from tests.helpers.metrics import samples


def value(metrics: NodeMetrics, name: str, **labels: str) -> float:
    return samples(metrics.exposition().decode()).get((name, tuple(sorted(labels.items()))), 0.0)


def test_every_metric_is_exported_with_its_conventional_name() -> None:
    metrics = NodeMetrics()
    metrics.outer_step_done(
        train_loss=2.0, tokens_trained=1, averaging_bytes_sent=1
    )  # the loss gauge appears
    exported = text_string_to_metric_families(metrics.exposition().decode())
    families = {family.name: family.type for family in exported if family.name.startswith("hivenet_")}
    assert families == {
        "hivenet_outer_steps": "counter",
        "hivenet_train_loss": "gauge",
        "hivenet_tokens": "counter",
        "hivenet_bytes_sent": "counter",
        "hivenet_bytes_received": "counter",
        "hivenet_chunks_served": "counter",
        "hivenet_chunks_fetched": "counter",
        "hivenet_rollouts": "counter",
        "hivenet_rollouts_rejected": "counter",
        "hivenet_verification_seconds": "histogram",
        "hivenet_bans": "counter",
        "hivenet_live_peers": "gauge",
        "hivenet_receipts_pulled": "counter",
        "hivenet_build_info": "gauge",  # an info metric, as the text format carries it
    }


def test_counters_move_with_the_events_and_the_figures_agree() -> None:
    metrics = NodeMetrics()
    metrics.outer_step_done(train_loss=2.5, tokens_trained=1000, averaging_bytes_sent=4096)
    metrics.outer_step_done(train_loss=2.25, tokens_trained=1000, averaging_bytes_sent=4096)
    metrics.chunk_served(100)
    metrics.manifest_served(10)
    metrics.chunk_received(100)
    metrics.chunk_received(100)  # a duplicate: received, but only one new chunk
    metrics.chunk_fetched()
    metrics.rollouts_generated(3, tokens=300)
    metrics.rollout_judged("accepted", seconds=0.2)
    metrics.rollout_judged("rejected", "toploc mismatch", seconds=0.4)
    metrics.rollout_judged("rejected", "toploc mismatch", seconds=0.1)
    metrics.peer_banned("bad chunk: hash mismatch at 3")
    metrics.set_live_peers([["trainer"], ["trainer", "validator"], ["seed"]])
    metrics.receipts_pulled(stored=5, duplicate=2, expired=0, deferred=3)

    assert value(metrics, "hivenet_outer_steps_total") == 2
    assert value(metrics, "hivenet_train_loss") == 2.25
    assert value(metrics, "hivenet_tokens_total", role="trainer") == 2000
    assert value(metrics, "hivenet_tokens_total", role="inference") == 300
    assert value(metrics, "hivenet_bytes_sent_total", channel="averaging") == 8192
    assert value(metrics, "hivenet_bytes_sent_total", channel="broadcast") == 110
    assert value(metrics, "hivenet_bytes_received_total", channel="broadcast") == 200
    assert value(metrics, "hivenet_chunks_served_total") == 1
    assert value(metrics, "hivenet_chunks_fetched_total") == 1
    assert value(metrics, "hivenet_rollouts_total", outcome="generated") == 3
    assert value(metrics, "hivenet_rollouts_total", outcome="accepted") == 1
    assert value(metrics, "hivenet_rollouts_total", outcome="rejected") == 2
    assert value(metrics, "hivenet_rollouts_rejected_total", reason="toploc mismatch") == 2
    assert value(metrics, "hivenet_verification_seconds_count") == 3
    assert value(metrics, "hivenet_verification_seconds_sum") == pytest.approx(0.7)
    assert value(metrics, "hivenet_bans_total", reason="bad chunk") == 1
    assert value(metrics, "hivenet_live_peers", role="trainer") == 2
    assert value(metrics, "hivenet_live_peers", role="validator") == 1
    assert value(metrics, "hivenet_receipts_pulled_total", outcome="deferred") == 3

    figures = metrics.figures()
    assert figures.outer_steps == 2 and figures.train_loss == 2.25
    assert figures.tokens == {"trainer": 2000, "inference": 300}
    assert figures.bytes_sent == {"averaging": 8192, "broadcast": 110}
    assert figures.chunks_served == 1 and figures.chunks_fetched == 1
    assert figures.rollouts == {"generated": 3, "accepted": 1, "rejected": 2}
    assert figures.rejections == {"toploc mismatch": 2}
    assert figures.verifications == 3 and figures.verification_seconds == pytest.approx(0.7)
    assert figures.bans == {"bad chunk": 1}
    assert figures.live_peers == {"trainer": 2, "validator": 1, "seed": 1}
    assert figures.receipts_pulled == {"stored": 5, "duplicate": 2, "deferred": 3}

    metrics.set_live_peers([["trainer"]])  # the others left: their roles drop to zero, not stay stale
    assert metrics.figures().live_peers == {"trainer": 1, "validator": 0, "seed": 0}


def test_a_fresh_node_reports_no_loss_and_an_unknown_outcome_is_refused() -> None:
    metrics = NodeMetrics()
    assert metrics.figures().train_loss is None and metrics.figures().outer_steps == 0
    with pytest.raises(ValueError, match="outcome"):
        metrics.rollout_judged("maybe", "")  # type: ignore[arg-type]


def test_an_rl_step_exports_its_version_reward_staleness_and_loss_and_none_before() -> None:
    metrics = NodeMetrics()
    assert metrics.figures().policy_version is None and b"hivenet_policy_version" not in metrics.exposition()
    metrics.rl_step_done(version=3, mean_reward=0.25, mean_staleness=1.5, tokens_trained=40, loss=-0.125)
    figures = metrics.figures()
    assert (
        figures.rl_steps,
        figures.policy_version,
        figures.rl_reward,
        figures.rl_staleness,
        figures.rl_loss,
    ) == (
        1,
        3,
        0.25,
        1.5,
        -0.125,
    )
    assert b"hivenet_rl_loss -0.125" in metrics.exposition()
    assert figures.tokens["trainer"] == 40
    assert b"hivenet_policy_version 3.0" in metrics.exposition()


def test_two_nodes_in_one_process_keep_separate_metrics() -> None:
    first, second = NodeMetrics(), NodeMetrics()
    first.chunk_served(10)
    assert value(first, "hivenet_chunks_served_total") == 1
    assert value(second, "hivenet_chunks_served_total") == 0


def test_a_ban_list_counts_its_bans_by_category() -> None:
    metrics = NodeMetrics()
    bans = BanList(1.0, 10.0, owner="t", on_ban=metrics.peer_banned)
    bans.ban(b"\x00" * 34, "bad request: truncated")
    bans.ban(b"\x01" * 34, "bad request: oversized")
    bans.ban(b"\x01" * 34, "protocol violation")
    assert metrics.figures().bans == {"bad request": 2, "protocol violation": 1}
    assert ban_category("x" * 500 + ": y") == "x" * 64


def test_the_exposition_has_build_info_and_process_series_and_no_created_empty_or_untrained_series() -> None:
    metrics = NodeMetrics()
    metrics.rollouts_generated(2, tokens=10)
    metrics.rollout_judged("accepted")
    text = metrics.exposition().decode()
    assert "_created" not in text
    assert 'reason=""' not in text and "reason=" not in text.split("hivenet_rollouts_rejected")[0]
    assert "hivenet_train_loss" not in text  # this node has not trained
    assert re.search(r'^hivenet_build_info\{.*protocol="\d+".*version="[^"]+".*\} 1\.0$', text, re.M)
    assert re.search(r"^process_cpu_seconds_total \d", text, re.M)
    assert metrics.figures().train_loss is None
    metrics.outer_step_done(train_loss=1.5, tokens_trained=8, averaging_bytes_sent=0)
    assert "hivenet_train_loss 1.5" in metrics.exposition().decode() and metrics.figures().train_loss == 1.5


def test_the_readme_names_every_metric_a_node_can_export() -> None:
    """The README's metrics list had fallen behind the code (no RL or credit series)."""
    metrics = NodeMetrics()
    metrics.outer_step_done(train_loss=2.0, tokens_trained=1, averaging_bytes_sent=1)
    metrics.rl_step_done(version=1, mean_reward=0.5, mean_staleness=0.0, tokens_trained=1)
    metrics.set_credit(total=1.0, recent=1.0, untrusted=0.0)
    exported = {
        sample.name
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name.startswith("hivenet_")
    }
    readme = (Path(__file__).parents[3] / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(hivenet_[a-z_]+)", readme))
    # a histogram's series are named by its family in the README; a counter by its `_total` series
    missing = {
        name
        for name in exported
        if name not in named and re.sub(r"_(bucket|count|sum)$", "", name) not in named
    }
    assert not missing, f"README.md does not name these exported metrics: {sorted(missing)}"
