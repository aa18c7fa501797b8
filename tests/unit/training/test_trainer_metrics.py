"""A trainer's progress reports move its node's metrics by what each outer step added."""

from __future__ import annotations

from node.metrics import NodeMetrics
from training.diloco import OuterStepReport
from training.trainer_node import counting_progress


def _report(step: int, loss: float, tokens: int, bytes_sent: int) -> OuterStepReport:
    return OuterStepReport(
        peer="p", outer_step=step, train_loss=loss, eval_loss=None, num_peers=2, bytes_sent=bytes_sent,
        tokens=tokens, outer_hash="h", inner_time_s=1.0, wall_time_s=1.0,
    )  # fmt: skip


def test_reports_with_running_totals_become_increments() -> None:
    metrics, shown = NodeMetrics(), list[OuterStepReport]()
    progress = counting_progress(metrics, shown.append)
    progress(_report(1, 3.0, tokens=1024, bytes_sent=500))
    progress(_report(2, 2.5, tokens=2048, bytes_sent=1500))
    figures = metrics.figures()
    assert figures.outer_steps == 2 and figures.train_loss == 2.5
    assert figures.tokens == {"trainer": 2048}
    assert figures.bytes_sent == {"averaging": 1500}
    assert [report.outer_step for report in shown] == [1, 2]  # the caller's callback still sees every report
