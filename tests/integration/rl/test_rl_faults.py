"""Faults that cross the whole loop: a worker that dies mid-submission, a replayed group, an unknown version.

A seed, a trainer with its own validator, and a scripted worker that generates honest groups
with the run's initial policy (version 0) and submits them over the real submit protocol, or
misbehaves in one precise way. Each fault must get a clear rejection (or no verdict at all),
leave the trainer running, and never be trained on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from node.swarm import wait_until
from protocol.node_record import Role
from protocol.rollout_messages import rollout_hash
from tests.helpers.rl_loop import (
    TINY,
    LoopbackNodes,
    ScriptedWorker,
    assert_steps_settle_at,
    honest_group,
    tiny_run,
)
from training.model import TinyGPT
from training.rl_run import RLRunConfig
from training.rl_trainer import RLTrainer
from verification.rl_roles import start_rl_trainer
from verification.validator import Validator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Loop:
    config: RLRunConfig
    policy_v0: TinyGPT
    trainer: RLTrainer
    validator: Validator
    worker: ScriptedWorker
    other: ScriptedWorker

    def trained_steps(self, steps: int) -> None:
        assert_steps_settle_at(self.trainer, steps)


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    config = tiny_run(None, async_level=8)
    nodes = LoopbackNodes(tmp_path_factory.mktemp("rl-faults"), config.run_id)
    workers: list[ScriptedWorker] = []
    trainer = None
    try:
        policy = TinyGPT(TINY)
        policy_v0 = copy.deepcopy(policy).eval()
        trainer_node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR])
        trainer, validator = start_rl_trainer(trainer_node, config, policy)
        workers = [ScriptedWorker(nodes.add(n, [Role.INFERENCE]), config) for n in ("worker", "other")]
        yield Loop(config, policy_v0, trainer, validator, *workers)
    finally:
        if trainer is not None:
            trainer.stop()
        for worker in workers:
            worker.close()
        nodes.close()


def test_a_worker_that_dies_mid_submission_leaves_the_loop_running(loop: Loop) -> None:
    validator = loop.worker.validator(loop.trainer.node.identity.peer_id_bytes)
    group = honest_group(loop.policy_v0, loop.config, loop.worker.peer, 0, 0)
    steps = len(loop.trainer.reports)
    ended = loop.trainer.intake.streams_ended

    loop.worker.submit_cut_short(validator, loop.worker.seal(group))
    assert wait_until(lambda: loop.trainer.intake.streams_ended > ended, 60.0), "the stream was never closed"
    loop.trained_steps(steps)
    assert loop.trainer.alive
    assert loop.worker.peer not in loop.validator.stats().workers  # nothing of it was judged

    # the worker comes back and submits the same assignment whole: it is judged and trained on once
    verdicts = loop.worker.submit(validator, loop.worker.seal(group))
    assert [v.accepted for v in verdicts] == [True] * 4
    loop.trained_steps(steps + 1)
    assert {rollout_hash(r) for r in group.rollouts} <= loop.trainer.trained_hashes

    # and another worker's next group is judged as well
    other = honest_group(loop.policy_v0, loop.config, loop.other.peer, 0, 0)
    assert all(v.accepted for v in loop.other.submit(validator, loop.other.seal(other)))
    loop.trained_steps(steps + 2)


def test_a_replayed_group_gets_replay_verdicts_and_is_trained_on_once(loop: Loop) -> None:
    validator = loop.other.validator(loop.trainer.node.identity.peer_id_bytes)
    group = honest_group(loop.policy_v0, loop.config, loop.other.peer, 0, 1)
    steps = len(loop.trainer.reports)
    trained_before = loop.trainer.trained_from[loop.other.peer]

    assert all(v.accepted for v in loop.other.submit(validator, loop.other.seal(group)))
    loop.trained_steps(steps + 1)
    replayed = loop.other.submit(validator, loop.other.seal(group))
    assert [v.reason for v in replayed] == ["replay"] * 4 and not any(v.accepted for v in replayed)
    loop.trained_steps(steps + 1)
    assert loop.trainer.trained_from[loop.other.peer] == trained_before + 4
    stats = loop.validator.stats().workers[loop.other.peer]
    assert stats.rejected.get("replay") == 4 and stats.strikes == 0  # a replay is counted, not banned


def test_a_group_for_an_unknown_version_is_refused_and_the_assignment_stays_open(loop: Loop) -> None:
    validator = loop.other.validator(loop.trainer.node.identity.peer_id_bytes)
    future = loop.trainer.version + 5
    group = honest_group(loop.policy_v0, loop.config, loop.other.peer, future, 2)
    steps = len(loop.trainer.reports)

    verdicts = loop.other.submit(validator, loop.other.seal(group))
    assert [v.reason for v in verdicts] == ["unknown_version"] * 4
    loop.trained_steps(steps)
    assert loop.trainer.alive
    # the counter was not used up: the honest group for it is still judged
    honest = honest_group(loop.policy_v0, loop.config, loop.other.peer, 0, 2)
    assert all(v.accepted for v in loop.other.submit(validator, loop.other.seal(honest)))
    loop.trained_steps(steps + 1)


def test_a_group_submitted_under_another_workers_identity_is_refused(loop: Loop) -> None:
    # `worker` submits, sealed as its own, a group generated for `other`'s next assignment
    validator = loop.worker.validator(loop.trainer.node.identity.peer_id_bytes)
    stolen = honest_group(loop.policy_v0, loop.config, loop.other.peer, 0, 3)
    steps = len(loop.trainer.reports)

    verdicts = loop.worker.submit(validator, loop.worker.seal(stolen))
    assert not any(v.accepted for v in verdicts)
    assert {v.reason for v in verdicts} - {"group_rejected"} <= {"prompt_mismatch", "seed_mismatch"}
    loop.trained_steps(steps)
    assert loop.trainer.alive
    assert not {rollout_hash(r) for r in stolen.rollouts} & loop.trainer.trained_hashes
    assert loop.validator.stats().workers[loop.worker.peer].strikes == 1  # it claimed a prompt not its own
