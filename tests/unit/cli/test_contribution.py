"""The contribution line: work from the node's metrics, credit as the node's ledger counts it."""

from __future__ import annotations

from pathlib import Path

from cli.contribution import contribution_line
from node.ledger import Ledger, RunSigners
from node.metrics import NodeMetrics
from node.own_credit import CreditFigures, OwnCredit
from tests.helpers.receipts import RUN, new_peer, verdict


def test_a_worker_sees_its_work_and_the_credit_its_trusted_receipts_earned(tmp_path: Path) -> None:
    metrics = NodeMetrics()
    metrics.rollouts_generated(8, tokens=240)
    validator_key, validator = new_peer()
    _, worker = new_peer()
    with Ledger(tmp_path / "worker.db", RUN) as ledger:
        ledger.add_many([verdict(validator_key, worker, tokens=30) for _ in range(3)])
        ledger.add(verdict(validator_key, worker, tokens=30, accepted=False, reason="toploc_mantissa"))
        credit = OwnCredit(
            lambda: ledger, worker, signers=RunSigners(validators=frozenset({validator}))
        ).figures()
    line = contribution_line(metrics.figures(), credit)
    assert "8 rollouts (240 tokens) generated" in line
    assert "credit 90 " in line  # 1 point per accepted token


def test_receipts_from_untrusted_signers_earn_nothing(tmp_path: Path) -> None:
    sybil_key, _ = new_peer()
    _, worker = new_peer()
    with Ledger(tmp_path / "worker.db", RUN) as ledger:
        ledger.add(verdict(sybil_key, worker, tokens=30))
        credit = OwnCredit(lambda: ledger, worker).figures()
    line = contribution_line(NodeMetrics().figures(), credit)
    assert "credit 0 " in line and "30 from untrusted signers" in line


def test_a_node_without_receipts_or_a_ledger_says_so() -> None:
    metrics = NodeMetrics()
    metrics.chunk_served(1024)
    line = contribution_line(metrics.figures(), CreditFigures())
    assert line == "contributed: 1 weight chunks served | credit: no receipts yet"
    assert contribution_line(metrics.figures(), None).endswith("| credit: no ledger")


def test_an_rl_trainer_sees_its_grpo_steps_and_tokens_trained() -> None:
    """It used to say "contributed: nothing yet" after a hundred steps."""
    metrics = NodeMetrics()
    for version in (1, 2, 3):
        metrics.rl_step_done(version=version, mean_reward=0.5, mean_staleness=1.0, tokens_trained=100)
    line = contribution_line(metrics.figures(), None)
    assert line.startswith("contributed: 3 GRPO steps (policy v3), 300 tokens trained |")


def test_own_credit_is_recounted_only_when_stale_or_asked_fresh(tmp_path: Path) -> None:
    validator_key, validator = new_peer()
    _, me = new_peer()
    now = [0.0]
    with Ledger(tmp_path / "me.db", RUN) as ledger:
        own = OwnCredit(
            lambda: ledger, me, signers=RunSigners(validators=frozenset({validator})), clock=lambda: now[0]
        )
        assert own.figures() == CreditFigures()
        ledger.add(verdict(validator_key, me, tokens=10))
        assert own.figures() == CreditFigures()  # cached for max_age_s
        assert own.figures(fresh=True).total == 10  # type: ignore[union-attr]
        ledger.add(verdict(validator_key, me, tokens=5))
        now[0] += own.max_age_s
        assert own.figures().total == 15  # type: ignore[union-attr]
    assert OwnCredit(lambda: None, me).figures() is None


def test_a_standalone_validator_sees_the_tokens_trainers_took_from_it() -> None:
    metrics = NodeMetrics()
    metrics.rollout_judged("accepted")
    metrics.tokens_processed("validator", 160)
    line = contribution_line(metrics.figures(), None)
    assert line.startswith("contributed: 1 rollouts judged, 160 validated tokens taken by trainers |")
