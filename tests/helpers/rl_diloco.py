"""Helpers for the RL DiLoCo tests: scored rollouts, in-process averagers, fetching a trainer's weights.

* `scored_groups(seed, version, ...)`: random GRPO groups (byte tokens, varied rewards).
* `PairAverager`: a `training.diloco.RoundAverager` for trainers in threads of one process:
  every member's `start_average` waits for the others and gets the same mean (no network).
* `LoneAverager`: a round that never finds anybody (the trainer steps alone);
  `OutvotedAverager` one whose group's majority held another state, and `FixedStateSource`
  the state the trainer then downloads.
* `fetch_published(peers, root, run_id, version, publisher)`: join the swarm as a fresh peer
  that trusts only `publisher` and fetch `version` through the weight broadcast.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.collective.outer_state import OuterState
from node.collective.round_types import DoneAverage, PendingAverage, RoundOutcome
from node.dht_node import start_loopback_dht
from node.identity import create_identity
from protocol.manifest import Manifest
from training.grpo import ScoredRollout


def scored_groups(
    seed: int, version: int, *, groups: int = 1, group_size: int = 4, prompt_len: int = 6, length: int = 8
) -> list[list[ScoredRollout]]:
    """`groups` random groups of rollouts generated (nominally) by policy `version`."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(256) for _ in range(prompt_len)]
        gid = rng.randbytes(32)
        out.append(
            [
                ScoredRollout(
                    prompt_ids=list(prompt),
                    completion_ids=[rng.randrange(256) for _ in range(length)],
                    reward=(i + g) / group_size,
                    policy_version=version,
                    group_id=gid,
                )
                for i in range(group_size)
            ]
        )
    return out


class LoneAverager:
    """No other trainer ever shows up: every round is averaged alone."""

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        return DoneAverage(RoundOutcome(averaged=None, num_peers=1))

    def bytes_sent(self) -> int:
        return 0


class OutvotedAverager(LoneAverager):
    """Every round averages, but this trainer's state hash was not the group's majority."""

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        averaged = [g.clone() for g in pseudo_grads]
        return DoneAverage(RoundOutcome(averaged=averaged, num_peers=3, in_sync=False))


class FixedStateSource:
    """Serves one outer state to a trainer that resyncs; records what it was asked."""

    def __init__(self, state: OuterState) -> None:
        self.state = state
        self.asked: list[int] = []

    def fetch_state(self, *, newer_than: int, stop_event: threading.Event | None = None) -> OuterState | None:
        self.asked.append(newer_than)
        return self.state.clone() if self.state.step > newer_than else None


class PairAverager:
    """`size` members in threads of one process; each round gives every member the same mean."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, action=self._reduce)
        self._inputs: dict[int, list[torch.Tensor]] = {}
        self._mean: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.steps: list[int] = []

    def member(self, index: int) -> _Member:
        return _Member(self, index)

    def _reduce(self) -> None:
        parts = [self._inputs[i] for i in sorted(self._inputs)]
        self._mean = [sum(ts[1:], ts[0].clone()) / len(ts) for ts in zip(*parts, strict=True)]
        self._inputs.clear()

    def exchange(self, index: int, grads: Sequence[torch.Tensor], step: int) -> list[torch.Tensor]:
        with self._lock:
            self._inputs[index] = [g.clone() for g in grads]
            self.steps.append(step)
        self._barrier.wait(timeout=60)
        return [t.clone() for t in self._mean]


class _Member:
    def __init__(self, pair: PairAverager, index: int) -> None:
        self.pair, self.index = pair, index

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        mean = self.pair.exchange(self.index, pseudo_grads, step)
        return DoneAverage(RoundOutcome(averaged=mean, num_peers=self.pair.size))

    def bytes_sent(self) -> int:
        return 0


def fetch_published(
    peers: list[str], root: Path, run_id: str, version: int, publisher: str
) -> tuple[Manifest, dict[str, Any]]:
    """Fetch `version` of `run_id` as a fresh peer that accepts weights from `publisher` only."""
    name = f"fetcher-{publisher[-6:]}-v{version}"
    identity = create_identity(root / f"{name}.key")
    dht = start_loopback_dht(peers, identity=identity)

    async def fetch() -> tuple[Manifest, dict[str, Any]]:
        broadcast = WeightBroadcast(
            dht=dht,
            identity=identity,
            config=BroadcastConfig(store_dir=root / name, authorized_publishers=[publisher]),
        )
        await broadcast.start()
        try:
            entry = await asyncio.wait_for(broadcast.fetch(run_id, version), timeout=120)
            return entry.manifest, await broadcast.load(run_id, version)
        finally:
            await broadcast.stop()

    try:
        return asyncio.run(fetch())
    finally:
        dht.shutdown()
