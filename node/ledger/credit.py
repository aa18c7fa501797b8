"""Credit: what verified receipts are worth, per contributor and role, and how sybils are kept out.

Each receipt is worth points in its contributor's role (`CreditRates`): accepted rollout tokens
("inference"), tokens trained ("trainer"), MiB delivered ("broadcast"), services ("seed"),
completion tokens of the groups a standalone validator verified that a trainer took
("validator"). A rejected verdict is worth nothing. The same work is counted once: one claim per
rollout hash, per training round and per forwarded group for a contributor (however many
validators, group members or trainers signed it), one per (signer, source, manifest) transfer and
per seed service session.

Sybils. Anyone can mint keys and sign receipts for each other, so a receipt's credit counts only
when its signer is vouched for:
1. a signer whose role the run gives that kind of receipt counts in full
   (`node.ledger.signers.RunSigners`: rollout verdicts from its validators, training and
   validation receipts from its trainers, transfer and seed receipts from any of them);
2. a signer that itself holds credit from a trusted signer (one hop) counts too, but all the
   credit it grants is capped at the credit it earned from trusted signers, so a sybil ring
   bootstrapped by one honest contribution can mint no more than that contribution. This holds
   for transfer and seed receipts, and for training receipts only when the signer earned trainer
   credit (`node.ledger.signers.VOUCHING_ROLE`); its rollout verdicts and validation receipts
   count zero, since a credited worker could otherwise sign "accepted" for identities that did no
   work;
3. receipts from anyone else are kept and shown, but count zero ("untrusted").

The recent average is BOINC's RAC: credit decayed exponentially with a half-life (default one
day) and expressed per day, so a contributor earning r points a day steadily shows r, and one who
stops sees it halve every half-life.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from node.ledger.signers import VOUCHING_ROLE, RunSigners
from protocol.receipts import ROLES, Receipt, ReceiptKind

DEFAULT_HALF_LIFE_S = 86400.0
_DAY_S = 86400.0
_MIB = 1024 * 1024


@dataclass(frozen=True)
class CreditRates:
    """Points per unit of work, one rate per role (a convention, the same for every node of a run)."""

    per_token_generated: float = 1.0
    per_token_trained: float = 1.0
    per_mib_delivered: float = 100.0
    per_seed_service: float = 10.0
    per_token_validated: float = 0.25
    """Per completion token of a group a trainer took from a standalone validator. A worker decodes
    its completion one token at a time; the validator checks it in one prefill per rollout (the
    TOPLOC proofs and the reward recomputed over the whole sequence at once), batched, so a
    validated token costs a fraction of a generated one. A quarter of a generated token's rate
    pays for that pass and keeps validating worth less than generating the same tokens."""

    def of(self, receipt: Receipt) -> float:
        """The points `receipt` is worth if its signer counts."""
        if receipt.kind is ReceiptKind.ROLLOUT:
            return receipt.tokens * self.per_token_generated if receipt.accepted else 0.0
        if receipt.kind is ReceiptKind.TRAINING:
            return receipt.tokens * self.per_token_trained
        if receipt.kind is ReceiptKind.TRANSFER:
            return receipt.byte_count / _MIB * self.per_mib_delivered
        if receipt.kind is ReceiptKind.VALIDATION:
            return receipt.tokens * self.per_token_validated
        return receipt.count * self.per_seed_service


class Standing(enum.StrEnum):
    """How one receipt counts in a credit report."""

    TRUSTED = "trusted"
    """Signed by a signer the run trusts: counts in full."""
    VOUCHED = "vouched"
    """Signed by a signer holding credit from a trusted signer: counts up to that signer's budget."""
    CAPPED = "capped"
    """Vouched, but the signer's budget was already spent: counts zero."""
    UNTRUSTED = "untrusted"
    """Signed by anyone else: counts zero."""
    DUPLICATE = "duplicate"
    """The same work was already counted by another receipt."""
    REJECTED = "rejected"
    """A verdict rejecting the rollout: worth nothing."""


def claim_of(receipt: Receipt) -> tuple[Any, ...]:
    """What makes two receipts attest the same work (only one of them counts)."""
    if receipt.kind in (ReceiptKind.ROLLOUT, ReceiptKind.TRAINING, ReceiptKind.VALIDATION):
        return (receipt.kind, receipt.contributor, receipt.evidence)
    return (receipt.kind, receipt.signer, receipt.contributor, receipt.evidence)


def recent_weight(issued_at: float, now: float, half_life_s: float) -> float:
    """What one point earned at `issued_at` adds to the recent average (points per day) at `now`."""
    age = max(0.0, now - issued_at)
    return math.exp(-math.log(2) * age / half_life_s) * math.log(2) / half_life_s * _DAY_S


@dataclass
class RoleCredit:
    """One contributor's credit in one role."""

    total: float = 0.0
    recent: float = 0.0
    """Recent average, points per day."""
    untrusted: float = 0.0
    """Points from receipts that count zero (untrusted or capped signers): shown, never counted."""
    receipts: int = 0

    def to_json(self) -> dict[str, float | int]:
        return {
            "total": self.total,
            "recent": self.recent,
            "untrusted": self.untrusted,
            "receipts": self.receipts,
        }


@dataclass
class ContributorCredit:
    """A contributor's credit, per role and overall."""

    contributor: bytes
    roles: dict[str, RoleCredit] = field(default_factory=lambda: {role: RoleCredit() for role in ROLES})
    rejected: Counter[str] = field(default_factory=Counter)
    """Rollout verdicts against it, by reason (`abandoned`: tickets it let expire), from the run's
    validators only."""

    @property
    def total(self) -> float:
        return sum(credit.total for credit in self.roles.values())

    @property
    def recent(self) -> float:
        return sum(credit.recent for credit in self.roles.values())

    @property
    def untrusted(self) -> float:
        return sum(credit.untrusted for credit in self.roles.values())

    @property
    def receipts(self) -> int:
        return sum(credit.receipts for credit in self.roles.values())


@dataclass
class CreditReport:
    """Credit derived from a set of verified receipts at one instant."""

    now: float
    half_life_s: float
    trusted: frozenset[bytes]
    """Every signer with a role in the run (see `signers` for which kinds each may sign)."""
    signers: RunSigners
    vouchers: dict[bytes, float]
    """One-hop signers and the credit they may grant (what they earned from trusted signers)."""
    contributors: dict[bytes, ContributorCredit]
    standing: dict[bytes, Standing]
    """Receipt id -> how it counted."""
    counted: dict[bytes, float]
    """Receipt id -> points it counted (absent: zero)."""
    trainer_vouchers: frozenset[bytes] = frozenset()
    """The one-hop signers whose training receipts count (they earned trainer credit)."""

    def leaderboard(self) -> list[ContributorCredit]:
        """Contributors by total credit, then recent average, then raw untrusted points."""
        return sorted(
            self.contributors.values(), key=lambda c: (-c.total, -c.recent, -c.untrusted, c.contributor)
        )

    def counts_for(self, kind: ReceiptKind, signer: bytes) -> bool:
        """Whether receipts of `kind` signed by `signer` may count (in full, or vouched and capped)."""
        if self.signers.trusts(kind, signer):
            return True
        if kind is ReceiptKind.TRAINING:
            return signer in self.trainer_vouchers
        return kind in VOUCHING_ROLE and signer in self.vouchers

    def standing_counts(self) -> dict[str, int]:
        counts = dict.fromkeys((s.value for s in Standing), 0)
        for standing in self.standing.values():
            counts[standing.value] += 1
        return counts


@dataclass(slots=True)
class _Item:
    issued_at: float
    receipt_id: bytes
    signer: bytes
    contributor: bytes
    kind: ReceiptKind
    role: str
    claim: tuple[Any, ...]
    points: float


def compute_credit(
    receipts: Iterable[Receipt],
    *,
    trusted: Iterable[bytes] | RunSigners,
    now: float,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    rates: CreditRates | None = None,
) -> CreditReport:
    """Credit per contributor and role from verified `receipts` (see the module docstring for the rules).

    `trusted`: the run's signers by role, or PeerIDs trusted to sign every kind of receipt.
    """
    if not half_life_s > 0:
        raise ValueError(f"half-life must be positive, got {half_life_s}")
    rates = rates or CreditRates()
    signers = RunSigners.of(trusted)
    trusted_set = signers.everyone
    report = CreditReport(now, half_life_s, trusted_set, signers, {}, {}, {}, {})
    by_trusted: list[_Item] = []
    others: list[_Item] = []
    seen: set[bytes] = set()
    for receipt in receipts:
        if receipt.receipt_id in seen:
            continue
        seen.add(receipt.receipt_id)
        item = _Item(
            receipt.issued_at,
            receipt.receipt_id,
            receipt.signer,
            receipt.contributor,
            receipt.kind,
            receipt.role,
            claim_of(receipt),
            rates.of(receipt),
        )
        credit = _contributor(report, receipt.contributor)
        credit.roles[item.role].receipts += 1
        if item.points <= 0:
            report.standing[item.receipt_id] = Standing.REJECTED
            if receipt.kind is ReceiptKind.ROLLOUT and signers.trusts(receipt.kind, receipt.signer):
                credit.rejected[receipt.reason] += 1  # only the run's validators' word counts against it
        elif signers.trusts(item.kind, item.signer):
            by_trusted.append(item)
        else:
            others.append(item)

    claimed: set[tuple[Any, ...]] = set()
    earned: dict[bytes, float] = defaultdict(float)
    earned_in: dict[tuple[bytes, str], float] = defaultdict(float)
    for item in sorted(by_trusted, key=_order):
        if _count(report, item, item.points, Standing.TRUSTED, claimed):
            earned[item.contributor] += item.points
            earned_in[(item.contributor, item.role)] += item.points

    report.vouchers = {peer: points for peer, points in earned.items() if peer not in trusted_set}
    report.trainer_vouchers = frozenset(
        peer for peer in report.vouchers if earned_in[(peer, VOUCHING_ROLE[ReceiptKind.TRAINING] or "")] > 0
    )
    spent: dict[bytes, float] = defaultdict(float)
    for item in sorted(others, key=_order):
        budget = _vouched_budget(report.vouchers, earned_in, item)
        if budget is None:
            report.standing[item.receipt_id] = Standing.UNTRUSTED
            _contributor(report, item.contributor).roles[item.role].untrusted += item.points
        elif item.claim in claimed:
            report.standing[item.receipt_id] = Standing.DUPLICATE
        elif spent[item.signer] >= budget:
            report.standing[item.receipt_id] = Standing.CAPPED
            _contributor(report, item.contributor).roles[item.role].untrusted += item.points
        else:
            points = min(item.points, budget - spent[item.signer])
            spent[item.signer] += points
            _count(report, item, points, Standing.VOUCHED, claimed)
    return report


def _vouched_budget(
    vouchers: dict[bytes, float], earned_in: dict[tuple[bytes, str], float], item: _Item
) -> float | None:
    """What `item`'s signer may grant in all, if it may vouch for this kind of receipt at all."""
    if item.kind not in VOUCHING_ROLE or item.signer not in vouchers:
        return None
    role = VOUCHING_ROLE[item.kind]
    if role is not None and earned_in[(item.signer, role)] <= 0:
        return None
    return vouchers[item.signer]


def _order(item: _Item) -> tuple[float, bytes]:
    return (item.issued_at, item.receipt_id)


def _contributor(report: CreditReport, peer: bytes) -> ContributorCredit:
    credit = report.contributors.get(peer)
    if credit is None:
        credit = report.contributors[peer] = ContributorCredit(peer)
    return credit


def _count(
    report: CreditReport, item: _Item, points: float, standing: Standing, claimed: set[tuple[Any, ...]]
) -> bool:
    """Count `points` of `item` unless its claim was counted already; True if counted."""
    if item.claim in claimed:
        report.standing[item.receipt_id] = Standing.DUPLICATE
        return False
    claimed.add(item.claim)
    report.standing[item.receipt_id] = standing
    report.counted[item.receipt_id] = points
    role = _contributor(report, item.contributor).roles[item.role]
    role.total += points
    role.recent += points * recent_weight(item.issued_at, report.now, report.half_life_s)
    return True
