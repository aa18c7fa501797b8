"""A trainer that restarts mid-run, with a real inference worker following it.

The trainer checkpoints every version; it is stopped (node and all) and started again with the
same key, weights store and checkpoint. The worker, never restarted, must pick up the versions
the restarted trainer publishes and keep getting its groups accepted; nothing is trained twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node.identity import create_identity
from node.swarm import wait_until
from protocol.node_record import Role
from tests.helpers.rl_loop import TINY, LoopbackNodes, tiny_run
from training.model import TinyGPT
from training.rl_worker import InferenceWorker
from verification.rl_roles import start_rl_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_workers_follow_a_trainer_that_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    trainer_id = create_identity(tmp_path / "trainer.key").peer_id.to_base58()
    config = tiny_run(None, async_level=2, authorized_publishers=[trainer_id])
    checkpoint = tmp_path / "checkpoint"
    nodes = LoopbackNodes(tmp_path, config.run_id)
    worker = None
    trainers = []
    try:
        trainer, _ = start_rl_trainer(
            nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR]),
            config,
            TinyGPT(TINY),
            checkpoint_dir=checkpoint,
        )
        trainers.append(trainer)
        worker = InferenceWorker(nodes.add("worker", [Role.INFERENCE]), config).start()
        assert wait_until(lambda: trainer.version >= 2, 120.0, interval_s=0.5)
        trainer.stop()
        nodes.stop(trainer.node)
        resumed_at = trainer.version
        trained_before = len(trainer.trained_hashes)

        restarted, validator = start_rl_trainer(
            nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR]),
            config,
            TinyGPT(TINY),
            checkpoint_dir=checkpoint,
        )
        trainers.append(restarted)
        assert restarted.version == resumed_at and resumed_at in restarted.published_at
        assert wait_until(lambda: restarted.version >= resumed_at + 2, 180.0, interval_s=0.5)
        # the worker generated on a version the restarted trainer made, and it was accepted (a worker
        # follows the newest version, so it may skip one the trainer made quickly: any newer one counts)
        assert wait_until(lambda: max(worker.first_rollout_at) > resumed_at, 60.0, interval_s=0.5)
        stats = validator.stats().workers[worker.node.identity.peer_id_bytes]
        assert stats.accepted >= 8 and stats.strikes == 0
        assert set(stats.rejected) <= {"stale", "unknown_version"}, stats.rejected
        assert restarted.alive
        restarted.stop()  # settles its counts: a step adds its hashes before its report
        # nothing trained twice, across the restart
        trained = len(restarted.trained_hashes)
        assert trained == sum(r.rollouts for r in restarted.reports)
        assert not restarted.trained_hashes & trainer.trained_hashes
        assert trained_before == sum(r.rollouts for r in trainer.reports), [
            r.describe() for r in trainer.reports
        ]
    finally:
        if worker is not None:
            worker.stop()
        for t in trainers:
            t.stop()
        nodes.close()
