"""The contribution line: work from the node's metrics, credit only from receipts others signed."""

from __future__ import annotations

from cli.contribution import contribution_line
from node.metrics import NodeMetrics
from tests.helpers.receipts import RUN, new_peer, verdict


def test_a_worker_sees_its_work_and_the_credit_its_trusted_receipts_earned() -> None:
    metrics = NodeMetrics()
    metrics.rollouts_generated(8, tokens=240)
    validator_key, validator = new_peer()
    _, worker = new_peer()
    receipts = [verdict(validator_key, worker, tokens=30) for _ in range(3)]
    receipts.append(verdict(validator_key, worker, tokens=30, accepted=False, reason="toploc_mantissa"))

    line = contribution_line(metrics.figures(), me=worker, run_id=RUN, receipts=receipts, trusted=[validator])

    assert "8 rollouts (240 tokens) generated" in line
    assert "receipts 4 (3 accepted)" in line and "credit 90 " in line  # 1 point per accepted token


def test_receipts_from_untrusted_signers_earn_nothing() -> None:
    sybil_key, _ = new_peer()
    _, worker = new_peer()
    receipts = [verdict(sybil_key, worker, tokens=30)]
    line = contribution_line(NodeMetrics().figures(), me=worker, run_id=RUN, receipts=receipts, trusted=[])
    assert "credit 0 " in line and "30 from untrusted signers" in line


def test_a_node_without_receipts_says_so() -> None:
    metrics = NodeMetrics()
    metrics.chunk_served(1024)
    line = contribution_line(metrics.figures(), me=b"me", run_id=RUN)
    assert line == "contributed: 1 weight chunks served | credit: no receipts yet"


def test_an_rl_trainer_sees_its_grpo_steps_and_tokens_trained() -> None:
    """It used to say "contributed: nothing yet" after a hundred steps."""
    metrics = NodeMetrics()
    for version in (1, 2, 3):
        metrics.rl_step_done(version=version, mean_reward=0.5, mean_staleness=1.0, tokens_trained=100)
    line = contribution_line(metrics.figures(), me=b"me", run_id=RUN)
    assert line.startswith("contributed: 3 GRPO steps (policy v3), 300 tokens trained |")
