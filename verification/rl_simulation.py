"""A whole decentralized RL run on this machine: a seed, a trainer with its validator, and workers.

`simulate_rl(config, workers=3, cheaters={2: CheatMode.PRECISION}, ...)` starts every node in
this process on 127.0.0.1 (each with its own DHT and p2pd, exactly as on separate machines),
lets the workers follow the trainer's policy and submit rollouts until the trainer has made
`config.max_trainer_steps` steps, then tears everything down (also on errors and Ctrl-C). It
returns the trainer's step reports, every worker's group reports and the validator's per-worker
statistics: what `hivenet simulate --rl` prints and what `bench/rl.py` measures.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from node.config import NodeConfig
from node.identity import create_identity
from node.metrics import MetricsFigures
from node.node import HivenetNode
from protocol.errors import HivenetError
from protocol.node_record import Role
from training.model import TinyGPT
from training.rl_run import RLRunConfig
from training.rl_trainer import RLStepReport
from training.rl_worker import CheatMode, GroupReport, InferenceWorker
from verification.rl_roles import start_rl_trainer
from verification.validator import ValidatorStats

__all__ = ["RLSimulation", "simulate_rl"]

logger = logging.getLogger(__name__)

_POLL_S = 0.5


@dataclass
class RLSimulation:
    """Everything a simulated run produced."""

    steps: list[RLStepReport] = field(default_factory=list)
    groups: dict[str, list[GroupReport]] = field(default_factory=dict)
    """Group reports per worker name."""
    cheaters: dict[str, CheatMode] = field(default_factory=dict)
    worker_peers: dict[str, bytes] = field(default_factory=dict)
    validator_stats: ValidatorStats | None = None
    trained_from: dict[str, int] = field(default_factory=dict)
    """Rollouts each worker contributed to GRPO steps."""
    pickup_s: list[float] = field(default_factory=list)
    """Per (worker, version): seconds from the version's publication to its first rollout there."""
    stale_dropped: int = 0
    """Accepted rollouts the trainer dropped because they fell behind the async level."""
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    """Rollouts the validator rejected, by reason (all workers)."""
    accepted: dict[str, int] = field(default_factory=dict)
    """Verified rollouts that reached the trainer, per worker name."""
    worker_cpu_seconds: dict[str, float] = field(default_factory=dict)
    validator_cpu_seconds: float = 0.0
    final_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """The trainer's policy at the end."""
    metrics: dict[str, MetricsFigures] = field(default_factory=dict)
    """Each node's metrics at the end, by node name."""
    seconds: float = 0.0


def _node(
    root: Path, name: str, run_id: str, roles: list[Role], peers: list[str], *, dht_only: bool = False
) -> HivenetNode:
    config = NodeConfig(
        identity_path=root / f"{name}.key",
        weights_dir=root / f"{name}-weights",
        initial_peers=peers,
        roles=roles,
        public_name=name,
        run_id=run_id,
        host="127.0.0.1",
        record_ttl_s=20.0,
        refresh_interval_s=4.0,
    )
    return HivenetNode(config, dht_only=dht_only)


def simulate_rl(
    config: RLRunConfig,
    policy: TinyGPT,
    *,
    workers: int = 3,
    cheaters: dict[int, CheatMode] | None = None,
    on_step: Callable[[RLStepReport], None] | None = None,
    on_group: Callable[[str, GroupReport], None] | None = None,
    stop_event: threading.Event | None = None,
    root: Path | None = None,
    min_groups_each: int = 0,
    min_groups_timeout_s: float = 300.0,
) -> RLSimulation:
    """Run the RL loop on this machine until the trainer made `config.max_trainer_steps` steps.

    With `min_groups_each`, the run also goes on (the validator judging, the trainer done) until
    every worker had that many groups judged, or `min_groups_timeout_s` passed.
    """
    if config.max_trainer_steps is None:
        raise HivenetError("simulate_rl needs max_trainer_steps so that the run ends")
    cheaters = cheaters or {}
    torch.set_num_threads(1)
    stop = stop_event or threading.Event()
    started = time.monotonic()
    result = RLSimulation()
    nodes: list[HivenetNode] = []
    running: list[InferenceWorker] = []
    trainer = None
    with contextlib.ExitStack() as cleanup:
        if root is None:
            root = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hivenet-rl-")))
        try:
            seed = _node(root, "seed", config.run_id, [Role.SEED], [], dht_only=True)
            nodes.append(seed)
            seed.start()
            peers = seed.multiaddrs()
            trainer_peer = create_identity(root / "trainer.key").peer_id.to_base58()
            config = config.model_copy(update={"authorized_publishers": [trainer_peer]})
            trainer_node = _node(root, "trainer", config.run_id, [Role.TRAINER, Role.VALIDATOR], peers)
            nodes.append(trainer_node)
            trainer_node.start()
            trainer, validator = start_rl_trainer(trainer_node, config, policy, on_step=on_step)
            for i in range(workers):
                name = f"worker{i}"
                node = _node(root, name, config.run_id, [Role.INFERENCE], peers)
                nodes.append(node)
                node.start()
                cheat = cheaters.get(i)
                if cheat is not None:
                    result.cheaters[name] = cheat
                result.worker_peers[name] = node.identity.peer_id_bytes

                def report(r: GroupReport, name: str = name) -> None:
                    if on_group is not None:
                        on_group(name, r)

                running.append(InferenceWorker(node, config, cheat=cheat, on_group=report).start())
            while not stop.is_set() and trainer.alive:
                stop.wait(_POLL_S)
            deadline = time.monotonic() + min_groups_timeout_s
            while not stop.is_set() and time.monotonic() < deadline:
                if all(sum(not r.error for r in w.reports) >= min_groups_each for w in running):
                    break
                stop.wait(_POLL_S)
        finally:
            stop.set()
            for worker in running:
                worker.stop()
            if trainer is not None:
                trainer.stop()
                result.validator_stats = validator.stats()
            for node in nodes:
                result.metrics[node.config.public_name] = node.metrics.figures()
            for node in reversed(nodes):
                with contextlib.suppress(Exception):
                    node.stop()
    if trainer is not None:
        result.steps = list(trainer.reports)
        result.stale_dropped = trainer.stale_dropped
        result.final_state = trainer.learner.state_dict()
        result.validator_cpu_seconds = getattr(trainer.judge, "cpu_seconds", 0.0)
        by_peer = {peer: name for name, peer in result.worker_peers.items()}
        for worker_peer, count in trainer.trained_from.items():
            result.trained_from[by_peer.get(worker_peer, worker_peer.hex()[:8])] = count
        for worker, name in zip(running, result.worker_peers, strict=True):
            result.groups[name] = list(worker.reports)
            result.accepted[name] = sum(g.accepted for g in worker.reports)
            result.worker_cpu_seconds[name] = worker.cpu_seconds
            for g in worker.reports:
                for reason, n in g.rejected.items():
                    result.rejected_by_reason[reason] = result.rejected_by_reason.get(reason, 0) + n
            for version, first in worker.first_rollout_at.items():
                if version in trainer.published_at:
                    result.pickup_s.append(first - trainer.published_at[version])
    result.seconds = time.monotonic() - started
    return result
