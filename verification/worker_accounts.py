"""What a validator knows about each worker: verdicts by outcome and reason, tickets, bans.

Verdict counts live here; what happened to each worker's tickets (judged, abandoned, open) lives
in the validator's `verification.tickets.TicketBook`, and `WorkerAccounts.snapshot` joins the two.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from verification.tickets import TicketCounts

__all__ = ["ValidatorStats", "WorkerAccounts", "WorkerStats"]


@dataclass(frozen=True)
class WorkerStats:
    """One worker's record at this validator; rollout counts are per rollout verdict."""

    accepted: int
    """Rollouts accepted."""
    rejected: dict[str, int]
    """Rollouts rejected, by reason code."""
    tokens_accepted: int
    """Completion tokens in accepted rollouts."""
    groups: int
    """Groups judged (each closed one ticket)."""
    abandoned: int
    """Tickets that expired without a group."""
    strikes: int
    """Times this worker was banned."""
    banned_until: float | None
    """End of the current ban on the validator's clock (None when not banned)."""

    def describe(self) -> str:
        """One line: accepted, rejected by reason, abandoned, bans."""
        rejected = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rejected.items())) or "none"
        banned = f", banned {self.strikes}x" if self.strikes else ""
        return f"accepted {self.accepted}, rejected: {rejected}, abandoned {self.abandoned}{banned}"


@dataclass(frozen=True)
class ValidatorStats:
    """Every worker's record plus the totals."""

    workers: dict[bytes, WorkerStats]
    accepted: int
    rejected: dict[str, int]
    tokens_accepted: int
    groups: int
    abandoned: int
    banned_workers: int
    """Workers banned right now."""

    def describe_worker(self, worker: bytes) -> str:
        stats = self.workers.get(worker)
        return stats.describe() if stats is not None else "never submitted"

    def describe_totals(self) -> str:
        rejected = sum(self.rejected.values())
        return (
            f"judged {self.accepted + rejected} (accepted {self.accepted}), banned now {self.banned_workers}"
        )


@dataclass
class _Account:
    accepted: int = 0
    tokens_accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    banned_until: float | None = None


class WorkerAccounts:
    """Per-worker verdict counts (not thread-safe: the validator holds its lock)."""

    def __init__(self) -> None:
        self._accounts: dict[bytes, _Account] = {}

    def _account(self, worker: bytes) -> _Account:
        account = self._accounts.get(worker)
        if account is None:
            account = self._accounts[worker] = _Account()
        return account

    def workers(self) -> list[bytes]:
        return list(self._accounts)

    def record(self, worker: bytes, accepted: bool, reason: str, tokens: int) -> None:
        """Count one rollout verdict."""
        account = self._account(worker)
        if accepted:
            account.accepted += 1
            account.tokens_accepted += tokens
        else:
            account.rejected[reason] += 1

    def record_ban(self, worker: bytes, until: float) -> None:
        self._account(worker).banned_until = until

    def snapshot(
        self, strikes: dict[bytes, int], banned: set[bytes], tickets: dict[bytes, TicketCounts]
    ) -> ValidatorStats:
        """Frozen stats; `strikes` per worker and who is `banned` now come from the ban list, `tickets`
        from the ticket book (a worker with tickets but no verdict yet is listed too)."""
        workers: dict[bytes, WorkerStats] = {}
        rejected: Counter[str] = Counter()
        for worker in tickets.keys() - self._accounts.keys():
            self._account(worker)
        for worker, a in self._accounts.items():
            until = a.banned_until if worker in banned else None
            counts = tickets.get(worker, TicketCounts(0, 0, 0))
            workers[worker] = WorkerStats(
                accepted=a.accepted,
                rejected=dict(a.rejected),
                tokens_accepted=a.tokens_accepted,
                groups=counts.judged,
                abandoned=counts.abandoned,
                strikes=strikes.get(worker, 0),
                banned_until=until,
            )
            rejected.update(a.rejected)
        return ValidatorStats(
            workers=workers,
            accepted=sum(w.accepted for w in workers.values()),
            rejected=dict(rejected),
            tokens_accepted=sum(w.tokens_accepted for w in workers.values()),
            groups=sum(w.groups for w in workers.values()),
            abandoned=sum(w.abandoned for w in workers.values()),
            banned_workers=sum(w.banned_until is not None for w in workers.values()),
        )
