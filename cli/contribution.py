"""What a contributor sees in the terminal: what this node gave, and the credit its receipts earned.

`hivenet join` prints `contribution_line` at most once a minute and once at exit. Work is read
from the node's own metrics (tokens trained and generated, chunks served, outer and GRPO steps);
credit is the node's `own_credit` (`node.own_credit`): counted from its ledger with the run's
signers, as a dashboard over that ledger counts it, so the terminal, /status, /metrics and the
dashboard show one figure, never this node's own say-so.
"""

from __future__ import annotations

from node.metrics import MetricsFigures
from node.own_credit import CreditFigures

__all__ = ["contribution_line"]


def contribution_line(figures: MetricsFigures, credit: CreditFigures | None) -> str:
    """One line: this node's work so far (`figures`) and the credit its ledger counts (`credit`)."""
    parts = []
    if figures.outer_steps:
        parts.append(f"{figures.outer_steps} outer steps")
    if figures.rl_steps:
        parts.append(f"{figures.rl_steps} GRPO steps (policy v{figures.policy_version})")
    if figures.tokens.get("trainer"):
        parts.append(f"{figures.tokens['trainer']:,} tokens trained")
    generated = figures.rollouts.get("generated", 0)
    if generated:
        parts.append(f"{generated:,} rollouts ({figures.tokens.get('inference', 0):,} tokens) generated")
    judged = figures.rollouts.get("accepted", 0) + figures.rollouts.get("rejected", 0)
    if judged:
        parts.append(f"{judged:,} rollouts judged")
    if figures.tokens.get("validator"):
        parts.append(f"{figures.tokens['validator']:,} validated tokens taken by trainers")
    if figures.chunks_served:
        parts.append(f"{figures.chunks_served:,} weight chunks served")
    work = ", ".join(parts) or "nothing yet"
    if credit is None:
        return f"contributed: {work} | credit: no ledger"
    if not credit.receipts:
        return f"contributed: {work} | credit: no receipts yet"
    pending = f", {credit.untrusted:,.0f} from untrusted signers" if credit.untrusted else ""
    return (
        f"contributed: {work} | receipts {credit.receipts} | credit {credit.total:,.0f} "
        f"(recent {credit.recent:,.0f}/day{pending})"
    )
