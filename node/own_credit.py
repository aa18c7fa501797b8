"""This node's own credit, counted as a dashboard over its ledger counts it: one figure for its
terminal, its /status and its /metrics.

The credit comes from the node's ledger (the receipts it signed, those signed for it and those it
pulled) with the run's signers (`RunSigners`): exactly what `hivenet dashboard --ledger` over that
ledger shows with the same `--trainer` and `--validator`. It is a pass over the whole ledger, so
`OwnCredit` recomputes it at most once per `max_age_s` unless asked for a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from node.ledger import Ledger, RunSigners

__all__ = ["CreditFigures", "OwnCredit"]


class CreditFigures(BaseModel):
    """One contributor's credit in points, as a ledger's credit report has it."""

    model_config = ConfigDict(extra="forbid")

    total: float = 0.0
    """Points from receipts that count (signed by the run's signers, or vouched for by them)."""
    recent: float = 0.0
    """Recent average, points per day."""
    untrusted: float = 0.0
    """Points from receipts that count zero (signers the run does not trust): shown, never counted."""
    receipts: int = 0
    """Receipts crediting this node."""


class OwnCredit:
    """`figures()`: this node's credit from the ledger `ledger()` returns (None while it has none)."""

    def __init__(
        self,
        ledger: Callable[[], Ledger | None],
        me: bytes,
        *,
        signers: RunSigners | None = None,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self.me = me
        self.signers = signers or RunSigners()
        """The run's signers, by role; set by whoever knows the run (`hivenet join` for an RL run)."""
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, CreditFigures | None] | None = None

    def figures(self, *, fresh: bool = False) -> CreditFigures | None:
        """This node's credit, computed at most `max_age_s` ago (`fresh`: now); None without a ledger."""
        with self._lock:
            now = self._clock()
            if not fresh and self._cached is not None and now - self._cached[0] < self.max_age_s:
                return self._cached[1]
            ledger = self._ledger()
            figures = None
            if ledger is not None:
                mine = ledger.credit(trusted=self.signers).contributors.get(self.me)
                figures = CreditFigures()
                if mine is not None:
                    figures = CreditFigures(
                        total=mine.total, recent=mine.recent, untrusted=mine.untrusted, receipts=mine.receipts
                    )
            self._cached = (now, figures)
            return figures
