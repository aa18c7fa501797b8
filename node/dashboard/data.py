"""What the contributor dashboard shows, as JSON-able dicts, from discovery and a receipts ledger.

`DashboardData` holds a `Ledger` and the latest discovered node records (`set_live_nodes`, fed by
whoever polls the DHT) and answers one method per panel: `swarm`, `verification`, `weights`,
`leaderboard`, `credit_rules`, `history`, `training` (`node.dashboard.training_view`), `node` and
`receipts`. Every figure carries the API
path of the receipts behind it (`receipts_url`), so a person can go from a number to the signed
receipts and check them (`/api/receipt/<id>` returns the envelope itself).

Credit and aggregates come from one `LedgerSnapshot` (`node.dashboard.ledger_view.LedgerView`
keeps it current); each panel is computed once per snapshot and swarm view.
"""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode

from hivemind.p2p import PeerID

from node.dashboard.bans_view import bans_json
from node.dashboard.ledger_view import LedgerView
from node.dashboard.receipt_json import receipt_json
from node.dashboard.snapshot import RECENT_PER_FIGURE, LedgerSnapshot, time_edges
from node.dashboard.training_view import panel_json
from node.dashboard.weights_view import WEIGHTS_PAGE, newest_first, weights_page
from node.ledger import DEFAULT_HALF_LIFE_S, CreditRates, Ledger, RunSigners, Standing
from node.membership import LiveNode
from protocol.receipts import ROLES, Receipt, ReceiptKind

MAX_LIST = 500
_RATES = CreditRates()
_POINTS = {
    "inference": f"{_RATES.per_token_generated:g} per accepted rollout token",
    "trainer": f"{_RATES.per_token_trained:g} per token trained",
    "broadcast": f"{_RATES.per_mib_delivered:g} per MiB of weights delivered",
    "seed": f"{_RATES.per_seed_service:g} per seed service",
    "validator": f"{_RATES.per_token_validated:g} per token of a verified group a trainer took",
}
"""What one point of credit is, per role (the ledger's default rates, which the dashboard counts with)."""
"""Most receipts or leaderboard rows one answer lists."""
MAX_DETAILS = 50
"""Rejected rollouts of one node whose validator's detail is decoded from the signed verdict."""

Json = dict[str, Any]


def peer_text(peer: bytes) -> str:
    return str(PeerID(peer).to_base58())


def parse_peer(text: str) -> bytes:
    """PeerID bytes from base58 text; ValueError if it is not one."""
    try:
        return bytes(PeerID.from_base58(text).to_bytes())
    except Exception:
        raise ValueError(f"{text[:64]!r} is not a PeerID") from None


def receipts_url(**query: object) -> str:
    return "/api/receipts?" + urlencode({k: v for k, v in query.items() if v is not None})


class DashboardData:
    """The dashboard's data layer; see the module docstring. Safe to call from many threads."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        trusted: Iterable[bytes] | RunSigners,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        max_age_s: float = 30.0,
        count_ttl_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`max_age_s` and `count_ttl_s`: see `node.dashboard.ledger_view.LedgerView`."""
        self.ledger = ledger
        self.view = LedgerView(
            ledger, trusted=trusted, half_life_s=half_life_s, max_age_s=max_age_s, count_ttl_s=count_ttl_s,
            clock=clock,
        )  # fmt: skip
        self.run_id = ledger.run_id
        self.clock = clock
        self._live: list[LiveNode] | None = None
        self._live_at = 0.0
        self._swarm_generation = 0
        self._names: dict[bytes, str] = {}
        self._texts: dict[bytes, str] = {}
        self._memos: tuple[LedgerSnapshot | None, dict[tuple[Any, ...], Json]] = (None, {})

    # --- inputs ---

    def set_live_nodes(self, nodes: list[LiveNode]) -> None:
        """The nodes discovery found just now (remembered names outlive the nodes that gave them)."""
        for node in nodes:
            if node.record.public_name:
                self._names[node.record.peer_id] = node.record.public_name
        changed = self._live is None or [n.record for n in self._live] != [n.record for n in nodes]
        self._live, self._live_at = list(nodes), self.clock()
        if changed:
            self._swarm_generation += 1

    def version(self) -> Json:
        """What changes when a panel should be reloaded: the receipts its snapshot holds (not the
        ledger's: a large ledger's next snapshot is computed in the background) and the swarm's
        generation."""
        return {"receipts": self.snapshot().count, "swarm": self._swarm_generation}

    def snapshot(self) -> LedgerSnapshot:
        return self.view.snapshot()

    def _memo(self, key: tuple[Any, ...], compute: Callable[[LedgerSnapshot], Json]) -> Json:
        """A panel computed once per snapshot and swarm view (many clients ask for the same one)."""
        snap = self.snapshot()
        owner, memo = self._memos
        if owner is not snap:
            memo = {}
            self._memos = (snap, memo)
        key = (*key, self._swarm_generation)
        if key not in memo:
            memo[key] = compute(snap)
        return memo[key]

    def _text(self, peer: bytes) -> str:
        text = self._texts.get(peer)
        if text is None:
            text = self._texts[peer] = peer_text(peer)
        return text

    def _peer(self, peer: bytes) -> Json:
        return {"peer_id": self._text(peer), "name": self._names.get(peer, "")}

    # --- panels ---

    def swarm(self) -> Json:
        """The live nodes (by role, with their online time, when each last published its record, and
        from the last ledger snapshot, null before the first: its recent credit per day, the newest
        policy version of its accepted rollouts and its verified tokens per minute), or `connected:
        false` without discovery. `reachability` is what the node's own dial-back check found
        (self-reported). A node without a public name is labelled by its first role and short PeerID
        (`label`)."""
        now = self.clock()
        nodes = self._live or []
        latest = self.view.latest()  # the swarm is polled often: it never waits for a snapshot
        contributors = latest.report.contributors if latest is not None else None
        by_role: dict[str, int] = {}
        rows = []
        for node in nodes:
            record = node.record
            for role in record.roles:
                by_role[role.value] = by_role.get(role.value, 0) + 1
            peer = self._peer(record.peer_id)
            credit = contributors.get(record.peer_id) if contributors is not None else None
            work = latest.work.get(record.peer_id) if latest is not None else None
            rows.append(
                {
                    **peer,
                    "label": peer["name"] or f"{record.roles[0].value} {peer['peer_id'][-8:]}",
                    # a record's sequence number is the time it was signed (`node.signed_records`)
                    "last_seen_s": max(0.0, now - node.seq / 1e9),
                    "credit_recent": None
                    if contributors is None
                    else credit.recent
                    if credit is not None
                    else 0.0,
                    "policy_version": work.policy_version if work is not None else None,
                    "tokens_per_min": None if latest is None else work.tokens_per_min if work else 0.0,
                    "reachability": record.reachability.name.lower(),
                    "roles": [role.value for role in record.roles],
                    "software_version": record.software_version,
                    "online_s": max(0.0, now - record.started_at),
                    "started_at": record.started_at,
                    "cpu_count": record.capabilities.cpu_count,
                    "accelerator": record.capabilities.accelerator,
                    "page": f"/node/{self._text(record.peer_id)}",
                }
            )
        return {
            "run_id": self.run_id,
            "connected": self._live is not None,
            "refreshed_at": self._live_at or None,
            "nodes": len(nodes),
            "by_role": dict(sorted(by_role.items())),
            "list": rows,
        }

    def verification(self) -> Json:
        """Rollout verdicts: accepted, rejected by reason, and the peers whose work was rejected."""
        return self._memo(("verification",), self._verification)

    def _verification(self, snap: LedgerSnapshot) -> Json:
        peers = sorted(snap.rejected_peers.items(), key=lambda item: -sum(item[1].values()))
        return {
            "accepted": snap.accepted,
            "rejected": sum(snap.rejected.values()),
            "tokens_accepted": snap.tokens_accepted,
            "validators": len(snap.validators),
            "receipts_url": receipts_url(kind="rollout"),
            "rejected_receipts_url": receipts_url(standing="rejected"),
            "by_reason": [
                {"reason": reason, "count": n, "receipts_url": receipts_url(reason=reason)}
                for reason, n in snap.rejected.most_common()
            ],
            "rejected_peers": [
                {
                    **self._peer(peer),
                    "rejected": sum(reasons.values()),
                    "reasons": dict(reasons.most_common()),
                    "page": f"/node/{self._text(peer)}",
                }
                for peer, reasons in peers[:MAX_LIST]
            ],
            "banned": bans_json(snap.bans, now=snap.report.now, peer=self._peer, receipts_url=receipts_url),
            "history": self._history(snap),
        }

    def weights(self, limit: int = WEIGHTS_PAGE, before: int | None = None) -> Json:
        """A page of the weights versions known from transfer receipts (bytes delivered, sources and how
        fast they spread), newest first, below version `before` if given (`weights_view`)."""
        # the order is kept, not each page: a memo per `before` would grow with every cursor asked for
        order = self._memo(("weights",), lambda snap: {"order": newest_first(snap.versions.values())})
        return weights_page(order["order"], limit=limit, before=before, receipts_url=receipts_url)

    def leaderboard(self, limit: int = 100) -> Json:
        """Contributors by credit: public name, PeerID, credit per role, total and recent average."""
        return self._memo(("leaderboard", limit), lambda snap: self._leaderboard(snap, limit))

    def _leaderboard(self, snap: LedgerSnapshot, limit: int) -> Json:
        board = snap.report.leaderboard()
        rows = []
        for rank, item in enumerate(board[: min(limit, MAX_LIST)], start=1):
            text = self._text(item.contributor)
            rows.append(
                {
                    "rank": rank,
                    **self._peer(item.contributor),
                    "roles": {role: round(item.roles[role].total, 3) for role in ROLES},
                    "total": round(item.total, 3),
                    "recent": round(item.recent, 3),
                    "untrusted": round(item.untrusted, 3),
                    "receipts": item.receipts,
                    "page": f"/node/{text}",
                    "receipts_url": receipts_url(contributor=text),
                }
            )
        return {
            "run_id": self.run_id,
            "at": snap.report.now,
            "half_life_s": snap.report.half_life_s,
            "points": _POINTS,
            "contributors": len(board),
            "receipts": snap.count,
            "rows": rows,
        }

    def credit_rules(self) -> Json:
        """How sybils are kept out: the trusted signers, the vouching ones, and how receipts counted."""
        return self._memo(("credit_rules",), self._credit_rules)

    def _credit_rules(self, snap: LedgerSnapshot) -> Json:
        return {
            "trusted": [self._peer(peer) for peer in sorted(snap.report.trusted)],
            "vouchers": [
                {**self._peer(peer), "budget": round(budget, 3)}
                for peer, budget in sorted(snap.report.vouchers.items(), key=lambda item: -item[1])
            ],
            "standing": {
                name: {"count": n, "receipts_url": receipts_url(standing=name)}
                for name, n in snap.report.standing_counts().items()
            },
            "receipts": snap.count,
            "signers": len(snap.signers),
            "kinds": {
                kind.value: {
                    "count": snap.kinds.get(kind.value, 0),
                    "receipts_url": receipts_url(kind=kind.value),
                }
                for kind in ReceiptKind
            },
        }

    def training(self) -> Json:
        """Loss and reward curves, outer steps, tokens trained and bytes per token (see `training_view`)."""
        return self._memo(("training",), lambda snap: panel_json(snap.training, receipts_url))

    def _history(self, snap: LedgerSnapshot) -> Json:
        return {
            "edges": snap.history_edges,
            "credit": [round(v, 3) for v in snap.credit_history],
            "rejections": snap.rejection_history,
        }

    def history(self) -> Json:
        """Credit counted and rollouts rejected over time (the whole ledger)."""
        return self._history(self.snapshot())

    def node(self, peer: bytes) -> Json | None:
        """One node's page: its record if live, its credit, its receipts and why any work was rejected."""
        snap = self.snapshot()
        mine = self.view.read(lambda ledger: ledger.contributor_receipts(peer, newest=MAX_DETAILS))
        if any(
            r.receipt_id not in snap.report.standing for r in mine.newest
        ):  # stored since: credit them too
            snap = self.view.snapshot(fresh=True)
        live = next((n for n in self._live or [] if n.record.peer_id == peer), None)
        credit = snap.report.contributors.get(peer)
        timeline = snap.timelines.get(peer)
        if timeline is None and not mine.newest and live is None and credit is None:
            return None
        text = self._text(peer)
        start = timeline.issued[0] if timeline else snap.report.now - 3600
        edges = time_edges(start, snap.report.now)
        earned = timeline.cumulative_at(edges) if timeline else [0.0] * (len(edges) - 1)
        cumulative = [round(points, 3) for points in earned]
        rejections = snap.rejected_peers.get(peer, Counter())
        return {
            **self._peer(peer),
            "run_id": self.run_id,
            "live": live is not None,
            "roles": [role.value for role in live.record.roles] if live else [],
            "online_s": max(0.0, self.clock() - live.record.started_at) if live else None,
            "credit": {
                "total": round(credit.total, 3) if credit else 0.0,
                "recent": round(credit.recent, 3) if credit else 0.0,
                "untrusted": round(credit.untrusted, 3) if credit else 0.0,
                "roles": {role: c.to_json() for role, c in credit.roles.items()} if credit else {},
            },
            "vouching_budget": snap.report.vouchers.get(peer),
            "trusted_signer": peer in snap.report.trusted,
            "receipts": max(len(timeline) if timeline else 0, len(mine.newest)),
            "receipts_url": receipts_url(contributor=text),
            "rejections": {
                "count": sum(rejections.values()),
                "by_reason": [
                    {
                        "reason": reason,
                        "count": n,
                        "receipts_url": receipts_url(contributor=text, reason=reason),
                    }
                    for reason, n in rejections.most_common()
                ],
                "latest": [self._receipt_json(r, snap, detail=True) for r in mine.newest_rejected],
            },
            "latest": [self._receipt_json(r, snap) for r in mine.newest],
            "history": {"edges": edges, "cumulative_credit": cumulative},
        }

    def receipts(
        self,
        *,
        contributor: bytes | None = None,
        kind: str | None = None,
        reason: str | None = None,
        standing: str | None = None,
        version: int | None = None,
        step: int | None = None,
        limit: int = 100,
    ) -> Json:
        """Receipts behind a figure, newest first; ValueError for an unknown kind or standing.

        `step` (with kind training or rollout): the outer step or policy version of a training curve's point.

        With a contributor, all of that contributor's receipts are searched; without, the newest
        `RECENT_PER_FIGURE` behind the figure are (`complete` says which).
        """
        if kind is not None and kind not in {k.value for k in ReceiptKind}:
            raise ValueError(f"unknown receipt kind {kind[:32]!r}")
        if standing is not None and standing not in {s.value for s in Standing}:
            raise ValueError(f"unknown standing {standing[:32]!r}")
        if step is not None and kind not in (ReceiptKind.TRAINING.value, ReceiptKind.ROLLOUT.value):
            raise ValueError("step selects training or rollout receipts: give kind=training or kind=rollout")
        snap = self.snapshot()
        limit = max(1, min(limit, MAX_LIST))
        if contributor is not None:
            pool: list[Receipt] = self.view.read(
                lambda ledger: list(ledger.receipts(contributor=contributor))
            )[::-1]
            complete = True
        elif reason is not None:
            pool, complete = snap.behind("reason", reason), snap.rejected.get(reason, 0) <= RECENT_PER_FIGURE
        elif version is not None:
            pool = snap.behind("version", str(version))
            spread = snap.versions.get(version)
            complete = spread is None or spread.receipts <= RECENT_PER_FIGURE
        elif step is not None and (point := snap.training.behind(str(kind), step)) is not None:
            found = self.view.read(lambda ledger: [ledger.get(rid) for rid in point[0]])
            pool = sorted((r for r in found if r is not None), key=lambda r: -r.issued_at)
            complete = point[1] <= len(point[0])
        elif standing is not None:
            pool, complete = snap.behind("standing", standing), snap.count <= RECENT_PER_FIGURE
        elif kind is not None:
            pool, complete = snap.behind("kind", kind), snap.kinds.get(kind, 0) <= RECENT_PER_FIGURE
        else:
            pool = sorted(
                (r for k in ReceiptKind for r in snap.behind("kind", k.value)), key=lambda r: -r.issued_at
            )
            complete = snap.count <= RECENT_PER_FIGURE
        selected = [
            r
            for r in pool
            if (kind is None or r.kind.value == kind)
            and (reason is None or (r.kind is ReceiptKind.ROLLOUT and not r.accepted and r.reason == reason))
            and (version is None or (r.kind is ReceiptKind.TRANSFER and r.step == version))
            and (step is None or r.step == step)
            and (
                standing is None
                or snap.report.standing.get(r.receipt_id, Standing.UNTRUSTED).value == standing
            )
        ]
        return {
            "complete": complete,
            "matched": len(selected),
            "receipts": [self._receipt_json(r, snap) for r in selected[:limit]],
        }

    def receipt(self, rid: bytes) -> Json | None:
        """One receipt with its signed envelope (base64), which anyone can re-verify."""
        found = self.view.read(lambda ledger: ledger.get(rid))
        if found is None:
            return None
        return {
            **self._receipt_json(found, self.snapshot(), detail=True),
            "envelope": base64.b64encode(found.envelope).decode(),
        }

    def _receipt_json(self, receipt: Receipt, snap: LedgerSnapshot, *, detail: bool = False) -> Json:
        return receipt_json(
            receipt, snap, text=self._text, name=lambda peer: self._names.get(peer, ""), detail=detail
        )
