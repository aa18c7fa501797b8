"""A whole decentralized RL run on this machine: a seed, trainers with their validators, and workers.

`simulate_rl(config, workers=3, cheaters={2: CheatMode.PRECISION}, ...)` starts every node in
this process on 127.0.0.1 (each with its own DHT and p2pd, exactly as on separate machines),
lets the workers follow the trainer's policy and submit rollouts until the trainer has made
`config.max_trainer_steps` steps, then tears everything down (also on errors and Ctrl-C). It
returns the trainer's step reports, every worker's group reports and the validator's per-worker
statistics: what `hivenet simulate --rl` prints and what `bench/rl.py` measures.

With `trainers=n > 1` (and `config.diloco`), n trainer nodes, each with its own validator,
train the policy together with DiLoCo and all publish it; workers spread their groups over
the validators. `RLSimulation.trainers` then has what each trainer did; the run-wide fields
(`steps`, `validator_stats`, `final_state`) are the first trainer's.
"""

from __future__ import annotations

import contextlib
import copy
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
from protocol.manifest import Manifest
from protocol.node_record import Role
from training.causal_lm import CausalLM
from training.devices import resolve_device
from training.rl_diloco import DiLoCoUpdates, OuterStepRecord
from training.rl_grinder import GrindRecord
from training.rl_run import RLRunConfig
from training.rl_trainer import RLStepReport, RLTrainer
from training.rl_worker import CheatMode, GroupReport, InferenceWorker
from verification.rl_roles import TrainerJudge, start_rl_trainer
from verification.validator import Validator, ValidatorStats

__all__ = ["RLSimulation", "TrainerRecord", "simulate_rl"]

logger = logging.getLogger(__name__)

_POLL_S = 0.5


@dataclass
class TrainerRecord:
    """What one trainer of a simulated run did."""

    steps: list[RLStepReport]
    published_at: dict[int, float]
    manifests: dict[int, Manifest]
    """The manifest it published for each version."""
    trained_hashes: set[bytes]
    """Rollouts it trained on."""
    accepted_hashes: set[bytes]
    """Rollouts its own validator accepted."""
    outer_steps: list[OuterStepRecord]
    """Its DiLoCo outer steps (empty for a trainer alone)."""
    validator_stats: ValidatorStats
    final_state: dict[str, torch.Tensor]


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
    worker_decode_cpu_seconds: dict[str, float] = field(default_factory=dict)
    """Of each worker's CPU time, the part spent decoding alone (`InferenceWorker.decode_cpu_seconds`)."""
    validator_cpu_seconds: float = 0.0
    validator_rollouts_judged: int = 0
    validator_batches: list[int] = field(default_factory=list)
    """The size of every batch of groups the trainers' validators judged (groups judged together)."""
    final_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """The trainer's policy at the end."""
    metrics: dict[str, MetricsFigures] = field(default_factory=dict)
    """Each node's metrics at the end, by node name."""
    accepted_rewards: dict[str, dict[tuple[int, int], float]] = field(default_factory=dict)
    """The validator-recomputed reward of every accepted rollout by (counter, index in its group), per
    worker name (from its receipts)."""
    grind_records: dict[str, list[GrindRecord]] = field(default_factory=dict)
    """What each grinding worker did with each of its tickets (`training.rl_grinder`)."""
    trainers: dict[str, TrainerRecord] = field(default_factory=dict)
    """Each trainer's record, by node name ("trainer" alone, "trainer0", "trainer1", ... with several)."""
    seconds: float = 0.0


def _node(
    root: Path,
    name: str,
    run_id: str,
    roles: list[Role],
    peers: list[str],
    *,
    dht_only: bool = False,
    device: str = "cpu",
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
        device=device,
    )
    return HivenetNode(config, dht_only=dht_only)


def simulate_rl(
    config: RLRunConfig,
    policy: CausalLM,
    *,
    workers: int = 3,
    trainers: int = 1,
    cheaters: dict[int, CheatMode] | None = None,
    on_step: Callable[[RLStepReport], None] | None = None,
    on_group: Callable[[str, GroupReport], None] | None = None,
    stop_event: threading.Event | None = None,
    root: Path | None = None,
    min_groups_each: int = 0,
    min_groups_timeout_s: float = 300.0,
    after_training: Callable[[list[str], RLRunConfig], None] | None = None,
    device: str = "cpu",
) -> RLSimulation:
    """Run the RL loop on this machine until every trainer made `config.max_trainer_steps` steps.

    With `min_groups_each`, the run also goes on (the validator judging, the trainer done) until
    every worker had that many groups judged, or `min_groups_timeout_s` passed. Then
    `after_training(seed addresses, the run's config as the nodes got it)` runs while every node
    is still up (e.g. to fetch weights from each publisher). Every node runs its models on `device`.
    """
    if config.max_trainer_steps is None:
        raise HivenetError("simulate_rl needs max_trainer_steps so that the run ends")
    if trainers < 1 or (trainers > 1 and config.diloco is None):
        raise HivenetError("several trainers train together only with DiLoCo: set config.diloco")
    cheaters = cheaters or {}
    torch.set_num_threads(1)
    stop = stop_event or threading.Event()
    started = time.monotonic()
    result = RLSimulation()
    nodes: list[HivenetNode] = []
    running: list[InferenceWorker] = []
    started_trainers: dict[str, tuple[RLTrainer, Validator]] = {}
    with contextlib.ExitStack() as cleanup:
        if root is None:
            root = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hivenet-rl-")))
        try:
            seed = _node(root, "seed", config.run_id, [Role.SEED], [], dht_only=True)
            nodes.append(seed)
            seed.start()
            peers = seed.multiaddrs()
            names = ["trainer"] if trainers == 1 else [f"trainer{i}" for i in range(trainers)]
            publishers = [create_identity(root / f"{name}.key").peer_id.to_base58() for name in names]
            # one operator started every trainer: they publish the policy and, together, are the run's trainers
            admitted = publishers if config.diloco is not None else []
            config = config.model_copy(
                update={"authorized_publishers": publishers, "admitted_trainers": admitted}
            )
            for name in names:
                trainer_node = _node(
                    root, name, config.run_id, [Role.TRAINER, Role.VALIDATOR], peers, device=device
                )
                nodes.append(trainer_node)
                trainer_node.start()
                # every trainer starts from the same weights: DiLoCo keeps them bit-identical
                own_policy = (policy if trainers == 1 else copy.deepcopy(policy)).to(resolve_device(device))
                started_trainers[name] = start_rl_trainer(trainer_node, config, own_policy, on_step=on_step)
            for i in range(workers):
                name = f"worker{i}"
                node = _node(root, name, config.run_id, [Role.INFERENCE], peers, device=device)
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
            while not stop.is_set() and any(t.alive for t, _ in started_trainers.values()):
                stop.wait(_POLL_S)
            deadline = time.monotonic() + min_groups_timeout_s
            while not stop.is_set() and time.monotonic() < deadline:
                if all(sum(not r.error for r in w.reports) >= min_groups_each for w in running):
                    break
                stop.wait(_POLL_S)
            if after_training is not None and not stop.is_set():
                after_training(peers, config)
        finally:
            stop.set()
            for worker in running:
                worker.stop()
            for name, (each, its_validator) in started_trainers.items():
                each.stop()
                result.trainers[name] = _record(each, its_validator)
            for node in nodes:
                result.metrics[node.config.public_name] = node.metrics.figures()
            for node in reversed(nodes):
                with contextlib.suppress(Exception):
                    node.stop()
    if started_trainers:
        lead = next(iter(result.trainers.values()))
        result.steps = lead.steps
        result.validator_stats = lead.validator_stats
        result.final_state = lead.final_state
        all_trainers = [t for t, _ in started_trainers.values()]
        result.stale_dropped = sum(t.stale_dropped for t in all_trainers)
        result.validator_cpu_seconds = sum(getattr(t.judge, "cpu_seconds", 0.0) for t in all_trainers)
        result.validator_rollouts_judged = sum(getattr(t.judge, "rollouts_judged", 0) for t in all_trainers)
        result.validator_batches = [size for t in all_trainers for size in t.judging.batches]
        by_peer = {peer: name for name, peer in result.worker_peers.items()}
        for t in all_trainers:
            for worker_peer, count in t.trained_from.items():
                name = by_peer.get(worker_peer, worker_peer.hex()[:8])
                result.trained_from[name] = result.trained_from.get(name, 0) + count
        published_at: dict[int, float] = {}
        for t in all_trainers:
            for version, at in t.published_at.items():
                published_at[version] = min(at, published_at.get(version, at))
        for worker, name in zip(running, result.worker_peers, strict=True):
            result.groups[name] = list(worker.reports)
            result.accepted[name] = sum(g.accepted for g in worker.reports)
            result.worker_cpu_seconds[name] = worker.cpu_seconds
            result.worker_decode_cpu_seconds[name] = worker.decode_cpu_seconds
            result.accepted_rewards[name] = {
                (r.verdict.counter, r.verdict.index): r.verdict.reward
                for r in worker.receipts
                if r.verdict.accepted
            }
            if worker.grinder is not None:
                result.grind_records[name] = list(worker.grinder.records)
            for g in worker.reports:
                for reason, n in g.rejected.items():
                    result.rejected_by_reason[reason] = result.rejected_by_reason.get(reason, 0) + n
            for version, first in worker.first_rollout_at.items():
                if version in published_at:
                    result.pickup_s.append(first - published_at[version])
    result.seconds = time.monotonic() - started
    return result


def _record(trainer: RLTrainer, validator: Validator) -> TrainerRecord:
    judge = trainer.judge
    updates = trainer.updates
    return TrainerRecord(
        steps=list(trainer.reports),
        published_at=dict(trainer.published_at),
        manifests=dict(trainer.manifests),
        trained_hashes=set(trainer.trained_hashes),
        accepted_hashes=set(judge.accepted_hashes) if isinstance(judge, TrainerJudge) else set(),
        outer_steps=list(updates.records) if isinstance(updates, DiLoCoUpdates) else [],
        validator_stats=validator.stats(),
        final_state=trainer.learner.state_dict(),
    )
