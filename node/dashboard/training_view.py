"""The training panel: loss and reward curves, outer steps, tokens trained and bytes per token, from receipts.

Every figure comes from receipts the ledger verified, and only from signers the credit rule counts
(`node.ledger.credit`): the run's trusted signers and the one-hop signers they vouch for. Receipts
of anyone else are left out of every figure (and counted in `left_out`), so keys minted by the
thousand cannot draw the curves.

- Loss curve: per outer step, the median of the `signer_loss` each counted signer attested in its
  training receipts of that step (the signer's own mean inner loss, one value per signer and
  step), so one lying signer among honest ones cannot move it. A loss of 0 means "not reported"
  (receipts from before the field existed, or a loss that was not a number) and is left out.
- Reward curve: per policy version, the mean reward the validators recomputed for the rollouts
  they accepted; with it the RL figures: accepted rollouts, the newest policy version and its
  mean reward (an RL run without DiLoCo rounds has no training receipts, and the page then
  shows these in place of the outer-step figures).
- Tokens trained: the tokens of the training receipts that counted for credit (one per trainer
  and round, however many members of the group signed for it). Bytes exchanged: what each counted
  signer received from each member of its rounds. Bytes per token: the one over the other.

`TrainingTally` is fed each receipt of the snapshot pass (`node.dashboard.snapshot`), with its
envelope, and finished with that pass's credit report into `TrainingFigures`; `panel_json`
turns those into the panel's JSON. A curve has at most `MAX_POINTS` points, spread evenly over
the run (first and last included); each point keeps the ids of the newest `IDS_PER_POINT`
receipts behind it, so a person can go from a point to the signed receipts.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node.ledger import CreditReport, Standing
from protocol import receipts_pb2, rollouts_pb2
from protocol.receipts import Receipt, ReceiptKind, stored_payload

MAX_POINTS = 120
"""Most points on one curve."""
IDS_PER_POINT = 200
"""Newest receipt ids kept behind one point of a curve."""

_COUNTED = (Standing.TRUSTED, Standing.VOUCHED)


@dataclass(frozen=True)
class LossPoint:
    step: int
    loss: float
    """Median of the counted signers' losses at this outer step."""
    signers: int
    receipt_ids: tuple[bytes, ...]
    receipts: int
    """Training receipts of counted signers at this step (`receipt_ids` holds the newest of them)."""


@dataclass(frozen=True)
class RewardPoint:
    version: int
    reward: float
    """Mean reward of the rollouts accepted at this policy version."""
    rollouts: int
    receipt_ids: tuple[bytes, ...]


@dataclass(frozen=True)
class TrainingFigures:
    """What the training receipts and rollout verdicts of counted signers add up to."""

    outer_steps: int
    """Distinct outer steps attested."""
    latest_step: int | None
    tokens_trained: int
    bytes_exchanged: int
    receipts: int
    """Training receipts of counted signers."""
    left_out: int
    """Training receipts and accepted verdicts whose signer does not count."""
    loss: list[LossPoint] = field(default_factory=list)
    reward: list[RewardPoint] = field(default_factory=list)
    rollouts_accepted: int = 0
    """Accepted rollouts of counted validators, every policy version."""
    latest_version: int | None = None
    """Newest policy version with an accepted rollout."""
    latest_reward: float | None = None
    """Mean reward of the accepted rollouts of `latest_version`."""

    @property
    def bytes_per_token(self) -> float | None:
        return self.bytes_exchanged / self.tokens_trained if self.tokens_trained else None

    def behind(self, kind: str, step: int) -> tuple[tuple[bytes, ...], int] | None:
        """The receipt ids behind a curve's point (a training step or a policy version) and how
        many receipts it stands for; None if no point of that curve is at `step`."""
        if kind == ReceiptKind.TRAINING.value:
            for loss in self.loss:
                if loss.step == step:
                    return loss.receipt_ids, loss.receipts
        elif kind == ReceiptKind.ROLLOUT.value:
            for reward in self.reward:
                if reward.version == step:
                    return reward.receipt_ids, reward.rollouts
        return None


@dataclass(slots=True)
class _Rewards:
    total: float = 0.0
    count: int = 0
    ids: deque[bytes] = field(default_factory=lambda: deque(maxlen=IDS_PER_POINT))


class TrainingTally:
    """Collects training receipts and accepted verdicts in one pass; `finish` weighs them by signer."""

    def __init__(self) -> None:
        self._training: list[tuple[bytes, bytes, int, int, int, float]] = []
        """(receipt id, signer, outer step, tokens, bytes, signer loss) of every training receipt."""
        self._rewards: dict[tuple[int, bytes], _Rewards] = defaultdict(_Rewards)
        """(policy version, validator) -> rewards of the rollouts it accepted."""

    def add(self, receipt: Receipt) -> None:
        """Note one receipt (read with its envelope: the loss and the reward are only in there)."""
        if receipt.kind is ReceiptKind.TRAINING:
            loss = _payload_field(receipt.envelope, receipts_pb2.TrainingReceipt, "signer_loss")
            self._training.append(
                (receipt.receipt_id, receipt.signer, receipt.step, receipt.tokens, receipt.byte_count, loss)
            )
        elif receipt.kind is ReceiptKind.ROLLOUT and receipt.accepted:
            rewards = self._rewards[(receipt.step, receipt.signer)]
            rewards.total += _payload_field(receipt.envelope, rollouts_pb2.RolloutVerdict, "reward")
            rewards.count += 1
            rewards.ids.append(receipt.receipt_id)

    def finish(self, report: CreditReport) -> TrainingFigures:
        """The figures, counting only signers whose receipts of that kind count (`CreditReport.counts_for`):
        losses from the run's trainers and the volunteer trainers they vouch for, rewards from its
        validators."""

        losses: dict[int, dict[bytes, float]] = defaultdict(dict)
        step_ids: dict[int, deque[bytes]] = defaultdict(lambda: deque(maxlen=IDS_PER_POINT))
        step_receipts: dict[int, int] = defaultdict(int)
        tokens = nbytes = kept = left_out = 0
        for rid, signer, step, step_tokens, step_bytes, loss in self._training:
            if not report.counts_for(ReceiptKind.TRAINING, signer):
                left_out += 1
                continue
            kept += 1
            nbytes += step_bytes
            if report.standing.get(rid) in _COUNTED:
                tokens += step_tokens
            step_receipts[step] += 1
            step_ids[step].append(rid)
            if loss > 0:
                losses[step][signer] = loss  # one vote per signer and step
        loss_points = [
            LossPoint(
                step=step,
                loss=statistics.median(losses[step].values()),
                signers=len(losses[step]),
                receipt_ids=tuple(reversed(step_ids[step])),
                receipts=step_receipts[step],
            )
            for step in _spread(sorted(losses))
        ]

        by_version: dict[int, _Rewards] = defaultdict(_Rewards)
        for (version, signer), rewards in self._rewards.items():
            if not report.counts_for(ReceiptKind.ROLLOUT, signer):
                left_out += rewards.count
                continue
            merged = by_version[version]
            merged.total += rewards.total
            merged.count += rewards.count
            merged.ids.extend(rewards.ids)
        reward_points = [
            RewardPoint(
                version=version,
                reward=by_version[version].total / by_version[version].count,
                rollouts=by_version[version].count,
                receipt_ids=tuple(by_version[version].ids),
            )
            for version in _spread(sorted(by_version))
        ]
        latest = max(by_version, default=None)
        return TrainingFigures(
            rollouts_accepted=sum(rewards.count for rewards in by_version.values()),
            latest_version=latest,
            latest_reward=None if latest is None else by_version[latest].total / by_version[latest].count,
            outer_steps=len(step_receipts),
            latest_step=max(step_receipts, default=None),
            tokens_trained=tokens,
            bytes_exchanged=nbytes,
            receipts=kept,
            left_out=left_out,
            loss=loss_points,
            reward=reward_points,
        )


def _spread(keys: list[int], points: int = MAX_POINTS) -> list[int]:
    """At most `points` of sorted `keys`, evenly spread, first and last included."""
    if len(keys) <= points:
        return keys
    return [keys[round(i * (len(keys) - 1) / (points - 1))] for i in range(points)]


def _payload_field(envelope: bytes, message: Any, name: str) -> float:
    """A number from the payload of a stored envelope (verified when it was stored); 0 if absent."""
    decoded = stored_payload(envelope, message) if envelope else None
    return 0.0 if decoded is None else float(getattr(decoded, name))


def panel_json(figures: TrainingFigures, receipts_url: Callable[..., str]) -> dict[str, Any]:
    """The training panel's JSON; every figure and point names the receipts behind it."""
    training_url = receipts_url(kind=ReceiptKind.TRAINING.value)
    per_token = figures.bytes_per_token
    return {
        "outer_steps": figures.outer_steps,
        "latest_step": figures.latest_step,
        "tokens_trained": figures.tokens_trained,
        "bytes_exchanged": figures.bytes_exchanged,
        "bytes_per_token": None if per_token is None else round(per_token, 3),
        "receipts": figures.receipts,
        "left_out": figures.left_out,
        "receipts_url": training_url,
        "loss": [
            {
                "step": point.step,
                "loss": round(point.loss, 6),
                "signers": point.signers,
                "receipts": point.receipts,
                "receipts_url": receipts_url(kind=ReceiptKind.TRAINING.value, step=point.step),
            }
            for point in figures.loss
        ],
        "reward": [
            {
                "version": point.version,
                "reward": round(point.reward, 6),
                "rollouts": point.rollouts,
                "receipts_url": receipts_url(kind=ReceiptKind.ROLLOUT.value, step=point.version),
            }
            for point in figures.reward
        ],
        "rewards_url": receipts_url(kind=ReceiptKind.ROLLOUT.value),
        "rollouts_accepted": figures.rollouts_accepted,
        "latest_version": figures.latest_version,
        "latest_reward": None if figures.latest_reward is None else round(figures.latest_reward, 6),
        "latest_version_url": None
        if figures.latest_version is None
        else receipts_url(kind=ReceiptKind.ROLLOUT.value, step=figures.latest_version),
    }
