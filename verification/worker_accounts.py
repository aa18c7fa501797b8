"""What a validator knows about each worker: assignment counters used, verdicts, abandons, bans.

Counters: a worker's assignments are numbered 0, 1, 2, ... and each may be judged once (a
second group for a counter is a replay). Counters below the highest one judged that never
arrived are abandoned assignments: a worker that drops the assignments whose completions
score badly (to submit only good ones) shows up here. A counter that arrives late (two
groups submitted concurrently) is still judged and stops counting as abandoned, unless it is
more than `late_window` counters behind the highest: then it was written off for good, which
keeps the memory per worker bounded whatever counters a hostile worker sends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DEFAULT_LATE_WINDOW", "CounterLog", "ValidatorStats", "WorkerAccounts", "WorkerStats"]

DEFAULT_LATE_WINDOW = 256
"""How many counters behind its highest a worker's group may still arrive (honest workers keep a
few groups in flight at most)."""


class CounterLog:
    """The assignment counters one worker used, compacted below `highest - late_window`."""

    def __init__(self, late_window: int = DEFAULT_LATE_WINDOW) -> None:
        if late_window < 1:
            raise ValueError(f"late_window must be >= 1, got {late_window}")
        self.late_window = late_window
        self.floor = 0
        """Every counter below this is settled: used, or written off as abandoned."""
        self.highest = -1
        self.judged = 0
        """Counters judged in all."""
        self._used: set[int] = set()
        self._written_off = 0

    def status(self, counter: int) -> str:
        """`"open"` (may be judged), `"used"` (judged) or `"settled"` (too far behind: judged or written off)."""
        if counter in self._used:
            return "used"
        if counter < self.floor:
            return "settled"
        return "open"

    def use(self, counter: int) -> None:
        """Mark an open `counter` as judged."""
        if self.status(counter) != "open":
            raise ValueError(f"counter {counter} is not open")
        self._used.add(counter)
        self.judged += 1
        self.highest = max(self.highest, counter)
        new_floor = self.highest + 1 - self.late_window
        if new_floor > self.floor:
            settled = {c for c in self._used if c < new_floor}
            self._written_off += (new_floor - self.floor) - len(settled)
            self._used -= settled
            self.floor = new_floor

    @property
    def abandoned(self) -> int:
        """Counters below the highest judged one that were never judged (written off or still open)."""
        open_gaps = self.highest + 1 - self.floor - len(self._used) if self.highest >= self.floor else 0
        return self._written_off + open_gaps


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
    """Groups judged (each used one assignment counter)."""
    abandoned: int
    """Assignment counters skipped below the highest one judged."""
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
    counters: CounterLog
    accepted: int = 0
    tokens_accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    banned_until: float | None = None


class WorkerAccounts:
    """Per-worker counters and verdict counts (not thread-safe: the validator holds its lock)."""

    def __init__(self, late_window: int = DEFAULT_LATE_WINDOW) -> None:
        self.late_window = late_window
        self._accounts: dict[bytes, _Account] = {}

    def _account(self, worker: bytes) -> _Account:
        account = self._accounts.get(worker)
        if account is None:
            account = self._accounts[worker] = _Account(CounterLog(self.late_window))
        return account

    def workers(self) -> list[bytes]:
        return list(self._accounts)

    def counter_status(self, worker: bytes, counter: int) -> str:
        """See `CounterLog.status`; every counter of an unknown worker is open."""
        account = self._accounts.get(worker)
        return "open" if account is None else account.counters.status(counter)

    def use_counter(self, worker: bytes, counter: int) -> None:
        self._account(worker).counters.use(counter)

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

    def snapshot(self, strikes: dict[bytes, int], banned: set[bytes]) -> ValidatorStats:
        """Frozen stats; `strikes` per worker and who is `banned` now come from the ban list."""
        workers: dict[bytes, WorkerStats] = {}
        rejected: Counter[str] = Counter()
        for worker, a in self._accounts.items():
            until = a.banned_until if worker in banned else None
            workers[worker] = WorkerStats(
                accepted=a.accepted,
                rejected=dict(a.rejected),
                tokens_accepted=a.tokens_accepted,
                groups=a.counters.judged,
                abandoned=a.counters.abandoned,
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
