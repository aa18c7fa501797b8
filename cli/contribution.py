"""What a contributor sees in the terminal: what this node gave, and the credit its receipts earned.

`hivenet join` prints `contribution_line` at most once a minute and once at exit. Work is read
from the node's own metrics (tokens trained and generated, chunks served, outer and GRPO steps); credit
only from receipts other peers signed for this node (an inference worker's verdicts), counted by
the ledger's rules with the run's trainers and validators as the signers of their kinds, so the figure is the one a
ledger would compute, never this node's own say-so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from node.ledger.credit import compute_credit
from node.ledger.signers import RunSigners
from node.metrics import MetricsFigures
from protocol.errors import InvalidMessage
from protocol.receipts import Receipt, open_receipt

__all__ = ["contribution_line"]


def _opened(envelopes: Iterable[bytes], run_id: str) -> list[Receipt]:
    receipts = []
    for envelope in envelopes:
        try:
            receipts.append(open_receipt(envelope, run_id=run_id, audit=True))
        except InvalidMessage:
            continue  # already checked when received; an expired one simply no longer counts
    return receipts


def contribution_line(
    figures: MetricsFigures,
    *,
    me: bytes,
    run_id: str,
    receipts: Iterable[bytes] = (),
    trusted: Iterable[bytes] | RunSigners = (),
    now: float | None = None,
) -> str:
    """One line: this node's work so far and the credit its receipts earned."""
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
    if figures.chunks_served:
        parts.append(f"{figures.chunks_served:,} weight chunks served")
    work = ", ".join(parts) or "nothing yet"
    opened = _opened(receipts, run_id)
    if not opened:
        return f"contributed: {work} | credit: no receipts yet"
    report = compute_credit(opened, trusted=trusted, now=time.time() if now is None else now)
    mine = report.contributors.get(me)
    accepted = sum(1 for r in opened if r.contributor == me and r.accepted)
    if mine is None:
        return f"contributed: {work} | receipts {len(opened)} ({accepted} accepted), credit 0"
    pending = f", {mine.untrusted:,.0f} from untrusted signers" if mine.untrusted else ""
    return (
        f"contributed: {work} | receipts {len(opened)} ({accepted} accepted) | credit {mine.total:,.0f} "
        f"(recent {mine.recent:,.0f}/day{pending})"
    )
