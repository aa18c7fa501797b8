"""One pass over a ledger: the credit report and the aggregates the dashboard's panels show.

A `LedgerSnapshot` is computed from every stored receipt at one instant and then only read, so
the web server's threads share it without locks. It keeps counts, sums and, for each figure a
person may click, the newest few receipts behind it (`RECENT_PER_FIGURE`), and for each
contributor the issue times of its receipts with the credit they earned (`ContributorTimeline`,
16 bytes a receipt), so that a node page draws its credit history without reading the ledger;
the receipts themselves are read from the ledger's index when asked for, not kept here.
"""

from __future__ import annotations

import bisect
from array import array
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate

from node.dashboard.bans_view import BanTally, WorkerBans
from node.dashboard.training_view import TrainingFigures, TrainingTally
from node.dashboard.work_view import NodeWork, WorkTally
from node.ledger import CreditRates, CreditReport, RunSigners, compute_credit
from protocol.receipts import Receipt, ReceiptKind

RECENT_PER_FIGURE = 200
"""Newest receipts kept behind each clickable figure (rejections of one reason, one weights version...)."""
LATEST_KEPT = 2000
"""Newest receipts of the whole ledger kept to list them by standing (trusted, untrusted, capped...)."""
HISTORY_BUCKETS = 48
"""Points on the time plots."""


@dataclass
class VersionSpread:
    """What the transfer receipts say about one weights version."""

    version: int
    receipts: int = 0
    byte_count: int = 0
    chunks: int = 0
    sources: set[bytes] = field(default_factory=set)
    fetchers: set[bytes] = field(default_factory=set)
    first_at: float = float("inf")
    last_at: float = 0.0

    def add(self, receipt: Receipt) -> None:
        self.receipts += 1
        self.byte_count += receipt.byte_count
        self.chunks += receipt.chunks
        self.sources.add(receipt.contributor)
        self.fetchers.add(receipt.signer)
        self.first_at = min(self.first_at, receipt.issued_at)
        self.last_at = max(self.last_at, receipt.issued_at)


@dataclass(frozen=True)
class ContributorTimeline:
    """One contributor's receipts in time: issue times (ascending) and the credit counted up to each."""

    issued: array[float]
    cumulative: array[float]

    def __len__(self) -> int:
        return len(self.issued)

    def cumulative_at(self, edges: list[float]) -> list[float]:
        """Credit earned by receipts of each bucket between `edges` and all before it, as `bucket_of`
        places them (the first bucket takes what is earlier, the last what is later)."""
        points = []
        for end in edges[1:-1]:
            upto = bisect.bisect_left(self.issued, end)
            points.append(self.cumulative[upto - 1] if upto else 0.0)
        points.append(self.cumulative[-1] if self.cumulative else 0.0)
        return points


@dataclass
class LedgerSnapshot:
    """The credit report of a ledger and what its panels show, taken at `report.now`."""

    count: int
    report: CreditReport
    kinds: Counter[str]
    accepted: int
    rejected: Counter[str]
    """Rejected rollout verdicts by reason."""
    tokens_accepted: int
    validators: set[bytes]
    rejected_peers: dict[bytes, Counter[str]]
    """Contributors with rejected rollouts: reason -> count."""
    versions: dict[int, VersionSpread]
    signers: set[bytes]
    first_at: float
    last_at: float
    recent: dict[tuple[str, str], deque[Receipt]]
    """Newest receipts behind a figure: ("reason", r), ("kind", k), ("version", v), ("standing", s)."""
    history_edges: list[float]
    credit_history: list[float]
    """Points counted in each time bucket (ends at `history_edges[i + 1]`)."""
    rejection_history: list[int]
    training: TrainingFigures
    """The training panel's figures (`node.dashboard.training_view`)."""
    bans: list[WorkerBans]
    """Workers the run's trusted validators banned, latest ban first (`node.dashboard.bans_view`)."""
    timelines: dict[bytes, ContributorTimeline] = field(default_factory=dict)
    """Each contributor's receipts in time, with the credit they earned."""
    work: dict[bytes, NodeWork] = field(default_factory=dict)
    """Each contributor's recent verified work (`node.dashboard.work_view`)."""

    def behind(self, figure: str, value: str) -> list[Receipt]:
        """The newest receipts (newest first) behind a figure, at most `RECENT_PER_FIGURE`."""
        return list(reversed(self.recent.get((figure, value), ())))


def take_snapshot(
    receipts: Iterable[Receipt],
    *,
    count: int,
    trusted: Iterable[bytes] | RunSigners,
    now: float,
    half_life_s: float,
    rates: CreditRates | None = None,
) -> LedgerSnapshot:
    """Read `receipts` once (the ledger's `count` of them) and derive everything the panels show.

    The training panel's loss and reward, and the bans on record, are read from the envelopes:
    read `receipts` with them.
    """
    run_signers = RunSigners.of(trusted)
    kinds: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    rejected_peers: dict[bytes, Counter[str]] = defaultdict(Counter)
    versions: dict[int, VersionSpread] = {}
    validators: set[bytes] = set()
    signers: set[bytes] = set()
    recent: dict[tuple[str, str], deque[Receipt]] = defaultdict(lambda: deque(maxlen=RECENT_PER_FIGURE))
    accepted = tokens_accepted = 0
    first_at, last_at = float("inf"), 0.0
    latest: deque[Receipt] = deque(maxlen=LATEST_KEPT)
    timeline: list[tuple[float, bytes, bool, bytes]] = []
    training = TrainingTally()
    bans = BanTally(run_signers.validators)
    work = WorkTally(run_signers, now)

    def note(receipt: Receipt) -> Receipt:
        nonlocal accepted, tokens_accepted, first_at, last_at
        kinds[receipt.kind.value] += 1
        signers.add(receipt.signer)
        recent[("kind", receipt.kind.value)].append(receipt)
        first_at, last_at = min(first_at, receipt.issued_at), max(last_at, receipt.issued_at)
        if receipt.kind is ReceiptKind.ROLLOUT:
            validators.add(receipt.signer)
            if receipt.accepted:
                accepted += 1
                tokens_accepted += receipt.tokens
            else:
                rejected[receipt.reason] += 1
                rejected_peers[receipt.contributor][receipt.reason] += 1
                recent[("reason", receipt.reason)].append(receipt)
                bans.note(receipt)
        elif receipt.kind is ReceiptKind.TRANSFER:
            spread = versions.get(receipt.step)
            if spread is None:
                spread = versions[receipt.step] = VersionSpread(receipt.step)
            spread.add(receipt)
            recent[("version", str(receipt.step))].append(receipt)
        training.add(receipt)
        work.add(receipt)
        latest.append(receipt)
        rejection = receipt.kind is ReceiptKind.ROLLOUT and not receipt.accepted
        timeline.append((receipt.issued_at, receipt.receipt_id, rejection, receipt.contributor))
        return receipt

    report = compute_credit(
        (note(r) for r in receipts), trusted=run_signers, now=now, half_life_s=half_life_s, rates=rates
    )
    for receipt in latest:
        recent[("standing", report.standing[receipt.receipt_id].value)].append(receipt)
    edges, credit_history, rejection_history = _history(timeline, report, first_at, now)
    return LedgerSnapshot(
        count=count,
        report=report,
        kinds=kinds,
        accepted=accepted,
        rejected=rejected,
        tokens_accepted=tokens_accepted,
        validators=validators,
        rejected_peers=dict(rejected_peers),
        versions=versions,
        signers=signers,
        first_at=first_at if timeline else now,
        last_at=last_at if timeline else now,
        recent=dict(recent),
        history_edges=edges,
        credit_history=credit_history,
        rejection_history=rejection_history,
        training=training.finish(report),
        bans=bans.ranked(),
        timelines=_timelines(timeline, report),
        work=work.finish(),
    )


def time_edges(start: float, end: float, buckets: int = HISTORY_BUCKETS) -> list[float]:
    """`buckets + 1` evenly spaced instants from `start` to `end` (a one-second span at least)."""
    end = max(end, start + 1.0)
    step = (end - start) / buckets
    return [start + step * i for i in range(buckets)] + [end]


def bucket_of(edges: list[float], instant: float) -> int:
    return min(max(bisect.bisect_right(edges, instant) - 1, 0), len(edges) - 2)


def _timelines(
    timeline: list[tuple[float, bytes, bool, bytes]], report: CreditReport
) -> dict[bytes, ContributorTimeline]:
    earned: dict[bytes, list[tuple[float, float]]] = defaultdict(list)
    for issued_at, rid, _, contributor in timeline:
        earned[contributor].append((issued_at, report.counted.get(rid, 0.0)))
    timelines = {}
    for contributor, points in earned.items():
        points.sort()
        timelines[contributor] = ContributorTimeline(
            issued=array("d", (at for at, _ in points)),
            cumulative=array("d", accumulate(credit for _, credit in points)),
        )
    return timelines


def _history(
    timeline: list[tuple[float, bytes, bool, bytes]], report: CreditReport, first_at: float, now: float
) -> tuple[list[float], list[float], list[int]]:
    edges = time_edges(first_at if timeline else now - 3600.0, max(now, first_at))
    credit = [0.0] * (len(edges) - 1)
    rejections = [0] * (len(edges) - 1)
    for issued_at, rid, rejection, _ in timeline:
        bucket = bucket_of(edges, issued_at)
        credit[bucket] += report.counted.get(rid, 0.0)
        rejections[bucket] += rejection
    return edges, credit, rejections
