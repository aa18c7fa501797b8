"""Prometheus metrics of one node: what it trained, served, fetched, judged and banned.

`NodeMetrics` owns its own `CollectorRegistry` (never the global one: several nodes share a
process in tests and simulations) and defines every metric a node exports:

- `hivenet_outer_steps_total`, `hivenet_train_loss`: DiLoCo outer steps applied and the last
  mean inner training loss;
- `hivenet_tokens_total{role}`: tokens processed (`trainer`: trained, `inference`: generated,
  `validator`: completion tokens of verified groups a trainer took, per its validation receipts);
- `hivenet_bytes_sent_total{channel}`, `hivenet_bytes_received_total{channel}`: payload bytes
  (`averaging`: pseudo-gradients, `broadcast`: weight chunks and manifests);
- `hivenet_chunks_served_total`, `hivenet_chunks_fetched_total`: weight-broadcast chunks;
- `hivenet_rollouts_total{outcome}`: rollouts `generated`, `accepted` or `rejected`, and
  `hivenet_rollouts_rejected_total{reason}`: the rejections by reason;
- `hivenet_verification_seconds`: time to judge one rollout (histogram);
- `hivenet_bans_total{reason}`: peers banned, by the category of the offence;
- `hivenet_live_peers{role}`: live nodes of the run this node discovers, by role;
- `hivenet_receipts_pulled_total{outcome}`: receipts pulled from peers, by what became of them
  (`stored`, `duplicate`, `expired`: genuine but too old or from ahead of this clock, `deferred`:
  over their signer's quota, asked for again later);
- `hivenet_rl_steps_total`, `hivenet_policy_version`, `hivenet_rl_reward`, `hivenet_rl_staleness`,
  `hivenet_rl_loss`: an RL trainer's GRPO steps, the version it last published, and its last
  step's mean reward, staleness and loss (the figures of its progress line);
- `hivenet_build_info{version,protocol,python,hivemind}`: what this node runs (always 1), and the
  process collector's `process_*` series (CPU, memory, open files).

`hivenet_train_loss` appears once a loss was reported (a node that does not train exports none),
and no series carries a `_created` timestamp.

Components take the narrow piece they need (`TransferMetrics` for the weight broadcast, a
`(reason) -> None` callback for a `BanList`), so that a component built without a node uses
`NO_TRANSFER_METRICS` and counts nothing. `figures()` reads the same registry back for the
JSON status, so the two views cannot disagree.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Literal, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "METRICS_CONTENT_TYPE",
    "NO_TRANSFER_METRICS",
    "MetricsFigures",
    "NoTransferMetrics",
    "NodeMetrics",
    "RolloutOutcome",
    "TransferMetrics",
    "ban_category",
]

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
"""HTTP Content-Type of the Prometheus text exposition format."""

RolloutOutcome = Literal["accepted", "rejected"]

VERIFICATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Histogram buckets of the time to verify one rollout (a TOPLOC check is sub-second on a GPU)."""

MAX_LABEL_CHARS = 64
"""Label values come from code, but a reason may quote a peer's data: cap it to bound the series."""


def ban_category(reason: str) -> str:
    """The label of a ban reason: what precedes the first ':' ('bad chunk: hash mismatch' -> 'bad chunk')."""
    return reason.split(":", 1)[0].strip()[:MAX_LABEL_CHARS] or "unspecified"


class TransferMetrics(Protocol):
    """What the weight broadcast counts: chunks and manifests served, chunks received and fetched."""

    def chunk_served(self, num_bytes: int) -> None:
        """A chunk of `num_bytes` was uploaded to a peer."""

    def manifest_served(self, num_bytes: int) -> None:
        """A signed manifest of `num_bytes` was uploaded to a peer."""

    def chunk_received(self, num_bytes: int) -> None:
        """A chunk payload arrived from a peer (before verification: bad ones and duplicates count)."""

    def chunk_fetched(self) -> None:
        """A received chunk was verified and stored (a new chunk of the version)."""


class NoTransferMetrics:
    """Counts nothing: the default of a weight broadcast that is not hosted by a node."""

    def chunk_served(self, num_bytes: int) -> None:
        pass

    def manifest_served(self, num_bytes: int) -> None:
        pass

    def chunk_received(self, num_bytes: int) -> None:
        pass

    def chunk_fetched(self) -> None:
        pass


NO_TRANSFER_METRICS = NoTransferMetrics()


class MetricsFigures(BaseModel):
    """The node's metrics as plain numbers, for the JSON status (same values as /metrics)."""

    model_config = ConfigDict(extra="forbid")

    outer_steps: int = 0
    train_loss: float | None = None
    """Last mean inner training loss; None before the first outer step."""
    tokens: dict[str, int] = Field(default_factory=dict)
    """Tokens by role."""
    bytes_sent: dict[str, int] = Field(default_factory=dict)
    """Bytes sent by channel."""
    bytes_received: dict[str, int] = Field(default_factory=dict)
    """Bytes received by channel."""
    chunks_served: int = 0
    chunks_fetched: int = 0
    rollouts: dict[str, int] = Field(default_factory=dict)
    """Rollouts by outcome (generated, accepted, rejected)."""
    rejections: dict[str, int] = Field(default_factory=dict)
    """Rejected rollouts by reason."""
    verifications: int = 0
    """Rollouts judged."""
    verification_seconds: float = 0.0
    """Total time spent judging them."""
    bans: dict[str, int] = Field(default_factory=dict)
    """Bans by reason."""
    live_peers: dict[str, int] = Field(default_factory=dict)
    """Live nodes of the run by role."""
    receipts_pulled: dict[str, int] = Field(default_factory=dict)
    """Receipts pulled from peers, by outcome (stored, duplicate, expired, deferred)."""
    rl_steps: int = 0
    """GRPO steps taken by this node's RL trainer."""
    policy_version: int | None = None
    """The policy version its RL trainer last published; None on a node that trains no policy."""
    rl_reward: float | None = None
    """Mean reward of the verified rollouts its last GRPO step learnt from."""
    rl_staleness: float | None = None
    """Mean staleness (trainer version minus rollout version) of that step's rollouts."""
    rl_loss: float | None = None
    """GRPO loss of that step (what its progress line prints)."""
    credit: dict[str, float] = Field(default_factory=dict)
    """This node's credit from its ledger, in points: total, recent (per day) and untrusted."""


class NodeMetrics:
    """Every metric of one node, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._outer_steps = Counter(
            "hivenet_outer_steps", "DiLoCo outer steps applied by this node.", registry=registry
        )
        self._train_loss: Gauge | None = (
            None  # registered with the first loss: a node that does not train has none
        )
        self._rl: tuple[Counter, Gauge, Gauge, Gauge, Gauge] | None = (
            None  # registered with the first GRPO step
        )
        self._credit: Gauge | None = None  # registered once the node has a ledger to count from
        self._tokens = Counter(
            "hivenet_tokens",
            "Tokens processed, by role (trainer: trained, inference: generated, validator: validated).",
            ["role"], registry=registry,
        )  # fmt: skip
        self._bytes_sent = Counter(
            "hivenet_bytes_sent", "Payload bytes sent to other peers, by channel.", ["channel"],
            registry=registry,
        )  # fmt: skip
        self._bytes_received = Counter(
            "hivenet_bytes_received", "Payload bytes received from other peers, by channel.", ["channel"],
            registry=registry,
        )  # fmt: skip
        self._chunks_served = Counter(
            "hivenet_chunks_served", "Weight-broadcast chunks uploaded to other peers.", registry=registry
        )
        self._chunks_fetched = Counter(
            "hivenet_chunks_fetched",
            "Weight-broadcast chunks downloaded from other peers.",
            registry=registry,
        )
        self._rollouts = Counter(
            "hivenet_rollouts", "Rollouts generated, accepted or rejected.", ["outcome"], registry=registry
        )
        self._rejections = Counter(
            "hivenet_rollouts_rejected", "Rollouts rejected, by reason.", ["reason"], registry=registry
        )
        self._verification = Histogram(
            "hivenet_verification_seconds", "Time to judge one rollout.",
            buckets=VERIFICATION_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self._bans = Counter("hivenet_bans", "Peers banned, by reason.", ["reason"], registry=registry)
        self._live_peers = Gauge(
            "hivenet_live_peers", "Live nodes of the run this node discovers, by role.", ["role"],
            registry=registry,
        )  # fmt: skip
        self._live_roles: set[str] = set()
        self._receipts_pulled = Counter(
            "hivenet_receipts_pulled", "Receipts pulled from peers, by outcome (stored, duplicate, expired, deferred).",
            ["outcome"], registry=registry,
        )  # fmt: skip
        Info("hivenet_build", "What this node runs.", registry=registry).info(_build_labels())
        ProcessCollector(registry=registry)

    # ---- training --------------------------------------------------------------------

    def outer_step_done(self, *, train_loss: float, tokens_trained: int, averaging_bytes_sent: int) -> None:
        """One outer step applied; `tokens_trained` and `averaging_bytes_sent` are what it added (not totals)."""
        self._outer_steps.inc()
        if self._train_loss is None:
            self._train_loss = Gauge(
                "hivenet_train_loss",
                "Mean inner training loss of the last outer step.",
                registry=self.registry,
            )
        self._train_loss.set(train_loss)
        self.tokens_processed("trainer", tokens_trained)
        self.bytes_sent("averaging", averaging_bytes_sent)

    def rl_step_done(
        self,
        *,
        version: int,
        mean_reward: float,
        mean_staleness: float,
        tokens_trained: int,
        loss: float = 0.0,
    ) -> None:
        """One GRPO step of this node's RL trainer, which produced policy `version`."""
        if self._rl is None:
            registry = self.registry
            self._rl = (
                Counter("hivenet_rl_steps", "GRPO steps taken by this node's RL trainer.", registry=registry),
                Gauge("hivenet_policy_version", "The policy version this node last published.", registry=registry),
                Gauge("hivenet_rl_reward", "Mean reward of the rollouts the last GRPO step learnt from.",
                      registry=registry),
                Gauge("hivenet_rl_staleness", "Mean staleness (versions) of the last GRPO step's rollouts.",
                      registry=registry),
                Gauge("hivenet_rl_loss", "GRPO loss (clipped surrogate) of the last step.", registry=registry),
            )  # fmt: skip
        steps, version_gauge, reward, staleness, loss_gauge = self._rl
        steps.inc()
        version_gauge.set(version)
        reward.set(mean_reward)
        staleness.set(mean_staleness)
        loss_gauge.set(loss)
        self.tokens_processed("trainer", tokens_trained)

    def set_credit(self, *, total: float, recent: float, untrusted: float) -> None:
        """This node's credit as its ledger counts it (`node.own_credit`)."""
        if self._credit is None:
            self._credit = Gauge(
                "hivenet_credit_points",
                "This node's credit from its ledger, in points: total, recent (per day), untrusted (counts zero).",
                ["kind"],
                registry=self.registry,
            )
        for kind, value in (("total", total), ("recent", recent), ("untrusted", untrusted)):
            self._credit.labels(kind=kind).set(value)

    def tokens_processed(self, role: str, count: int) -> None:
        if count > 0:
            self._tokens.labels(role=role).inc(count)

    def bytes_sent(self, channel: str, count: int) -> None:
        if count > 0:
            self._bytes_sent.labels(channel=channel).inc(count)

    def bytes_received(self, channel: str, count: int) -> None:
        if count > 0:
            self._bytes_received.labels(channel=channel).inc(count)

    # ---- weight broadcast (TransferMetrics) -------------------------------------------

    def chunk_served(self, num_bytes: int) -> None:
        self._chunks_served.inc()
        self.bytes_sent("broadcast", num_bytes)

    def manifest_served(self, num_bytes: int) -> None:
        self.bytes_sent("broadcast", num_bytes)

    def chunk_received(self, num_bytes: int) -> None:
        self.bytes_received("broadcast", num_bytes)

    def chunk_fetched(self) -> None:
        self._chunks_fetched.inc()

    # ---- rollouts and verification (fed by the RL roles) -------------------------------

    def rollouts_generated(self, count: int = 1, *, tokens: int = 0) -> None:
        """An inference worker produced `count` rollouts holding `tokens` generated tokens."""
        if count > 0:
            self._rollouts.labels(outcome="generated").inc(count)
        self.tokens_processed("inference", tokens)

    def rollout_judged(self, outcome: RolloutOutcome, reason: str = "", seconds: float | None = None) -> None:
        """A validator judged one rollout: `accepted`, or `rejected` with a reason; `seconds` it took."""
        if outcome not in ("accepted", "rejected"):
            raise ValueError(f"rollout outcome must be 'accepted' or 'rejected', not {outcome!r}")
        self._rollouts.labels(outcome=outcome).inc()
        if outcome == "rejected":
            self._rejections.labels(reason=reason[:MAX_LABEL_CHARS] or "unspecified").inc()
        if seconds is not None:
            self._verification.observe(max(0.0, seconds))

    # ---- bans and membership ----------------------------------------------------------

    def peer_banned(self, reason: str) -> None:
        """A peer was banned; `reason` is a BanList reason ('bad chunk: ...' counts as 'bad chunk')."""
        self._bans.labels(reason=ban_category(reason)).inc()

    def set_live_peers(self, roles_of_live_nodes: Iterable[Iterable[str]]) -> None:
        """The live nodes now discovered, each given by its roles (a node with two roles counts in both)."""
        counts: dict[str, int] = {}
        for roles in roles_of_live_nodes:
            for role in set(roles):
                counts[role] = counts.get(role, 0) + 1
        for role in self._live_roles - counts.keys():
            self._live_peers.labels(role=role).set(0)
        for role, count in counts.items():
            self._live_peers.labels(role=role).set(count)
        self._live_roles |= counts.keys()

    # ---- receipts exchange -------------------------------------------------------------

    def receipts_pulled(self, *, stored: int, duplicate: int, expired: int, deferred: int) -> None:
        """What one pull from a peer did with the receipts it received."""
        counts = {"stored": stored, "duplicate": duplicate, "expired": expired, "deferred": deferred}
        for outcome, count in counts.items():
            if count > 0:
                self._receipts_pulled.labels(outcome=outcome).inc(count)

    # ---- reading -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (what /metrics serves)."""
        return generate_latest(_WithoutCreated(self.registry))

    def figures(self) -> MetricsFigures:
        """The same values as plain numbers (read from the registry)."""
        figures = MetricsFigures()
        for family in self.registry.collect():
            for sample in family.samples:
                name, labels, value = sample.name, sample.labels, sample.value
                if name == "hivenet_outer_steps_total":
                    figures.outer_steps = int(value)
                elif name == "hivenet_train_loss":
                    figures.train_loss = value
                elif name == "hivenet_tokens_total":
                    figures.tokens[labels["role"]] = int(value)
                elif name == "hivenet_bytes_sent_total":
                    figures.bytes_sent[labels["channel"]] = int(value)
                elif name == "hivenet_bytes_received_total":
                    figures.bytes_received[labels["channel"]] = int(value)
                elif name == "hivenet_chunks_served_total":
                    figures.chunks_served = int(value)
                elif name == "hivenet_chunks_fetched_total":
                    figures.chunks_fetched = int(value)
                elif name == "hivenet_rollouts_total":
                    figures.rollouts[labels["outcome"]] = int(value)
                elif name == "hivenet_rollouts_rejected_total":
                    figures.rejections[labels["reason"]] = int(value)
                elif name == "hivenet_verification_seconds_count":
                    figures.verifications = int(value)
                elif name == "hivenet_verification_seconds_sum":
                    figures.verification_seconds = value
                elif name == "hivenet_bans_total":
                    figures.bans[labels["reason"]] = int(value)
                elif name == "hivenet_live_peers":
                    figures.live_peers[labels["role"]] = int(value)
                elif name == "hivenet_receipts_pulled_total":
                    figures.receipts_pulled[labels["outcome"]] = int(value)
                elif name == "hivenet_rl_steps_total":
                    figures.rl_steps = int(value)
                elif name == "hivenet_policy_version":
                    figures.policy_version = int(value)
                elif name == "hivenet_rl_reward":
                    figures.rl_reward = value
                elif name == "hivenet_rl_staleness":
                    figures.rl_staleness = value
                elif name == "hivenet_rl_loss":
                    figures.rl_loss = value
                elif name == "hivenet_credit_points":
                    figures.credit[labels["kind"]] = value
        return figures


class _WithoutCreated:
    """A registry's metrics less their `_created` samples (the time a series was first touched, which
    doubles every counter's series count and tells a scraper nothing it needs)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def _build_labels() -> dict[str, str]:
    from protocol.version import PROTOCOL_VERSION

    def version_of(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "version": version_of("hivenet"),
        "protocol": str(PROTOCOL_VERSION),
        "python": platform.python_version(),
        "hivemind": version_of("hivemind"),
    }
