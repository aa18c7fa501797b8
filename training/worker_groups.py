"""What an inference worker makes of each ticket: the generated group, its report, and the cheats
a dishonest worker can be made to try (for demos, tests and benchmarks)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from node.rollouts.client import Receipt
from protocol.rollout_messages import BANNED, GROUP_SIZE, STALE

__all__ = ["CheatMode", "GeneratedGroup", "GroupReport", "refusal_summary"]


class CheatMode(enum.StrEnum):
    """Ways a dishonest worker can cut corners (only for demos, tests and benchmarks)."""

    PRECISION = "precision"
    """Generates in bfloat16 but claims the run's precision."""
    WEIGHTS = "weights"
    """Generates with perturbed weights but names the real version."""
    GRINDER = "grinder"
    """Generates each ticket under every version it holds, submits the best, drops the worst
    (`training.rl_grinder`)."""


@dataclass(frozen=True)
class GeneratedGroup:
    """A generated group, sealed and waiting to be submitted."""

    counter: int
    version: int
    tokens: int
    seconds: float
    sealed: bytes


@dataclass
class GroupReport:
    """What happened to one submitted group."""

    counter: int
    version: int
    validator: str
    tokens: int
    seconds: float
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    error: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        if self.error:
            return f"group {self.counter:>4} | v{self.version} | not judged: {self.error}"
        rejected = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rejected.items())) or "0"
        return (
            f"group {self.counter:>4} | v{self.version} | accepted {self.accepted} | rejected {rejected} | "
            f"{self.tokens_per_s:,.0f} tokens/s | validator {self.validator}"
        )


def refusal_summary(outcomes: list[tuple[str, list[Receipt], str]]) -> str | None:
    """What stands in the worker's way after a submission: every validator that judged it banned it, or
    found its version stale (None when anything was judged on its merits)."""
    reasons = {
        (validator, receipt.verdict.reason) for validator, receipts, _ in outcomes for receipt in receipts
    }
    if reasons and all(reason == GROUP_SIZE for _, reason in reasons):
        details = {receipt.verdict.detail for _, receipts, _ in outcomes for receipt in receipts}
        return (
            f"validators refuse its groups: {'; '.join(sorted(details))}. Start this worker with the run's "
            "--group-size (every node of an RL run needs the same RL options)"
        )
    if not reasons or any(reason not in (BANNED, STALE) for _, reason in reasons):
        return None
    banned_by = sorted(validator for validator, reason in reasons if reason == BANNED)
    if banned_by:
        return f"banned by validator(s) {', '.join(banned_by)}; their bans expire, then it submits again"
    return (
        "its groups arrive stale (the trainer moved past their policy version); it follows the newest version"
    )
