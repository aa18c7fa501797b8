"""A trainer that restarts resumes from its checkpoint and republishes that version.

A real trainer node with a fake judge (groups enter through its intake handler), stopped and
started again with the same key, weights store and `checkpoint_dir`, as a restarted process is.
What must hold: the restarted trainer holds the checkpoint's weights, version and optimizer state
(so its next update is the one it would have made without the restart), hands that
version to its validator, republishes it (its store already holds it), and never publishes a
version number with weights other than those the network was given under it, even when it died
between publishing a version and checkpointing it. And with its own validator (`start_rl_trainer`),
a rollout accepted before the restart is refused as a replay after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from node.membership import LiveNode
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollouts_pb2 import RolloutGroup
from tests.helpers.broadcast import assert_state_dicts_equal
from tests.helpers.rl_diloco import LoneAverager
from tests.helpers.rl_loop import (
    TINY,
    FakeJudge,
    LoopbackNodes,
    ScriptedWorker,
    fake_group,
    honest_group,
    policy_at,
    submit_to_intake,
    tiny_run,
)
from tests.helpers.rollouts import key
from training.causal_lm import CausalLM
from training.checkpoint import CheckpointError
from training.grpo import GRPOConfig
from training.model import TinyGPT
from training.policy_updates import PolicyUpdates, UpdatesFactory, every_step_updates
from training.rl_checkpoint import optimizer_state
from training.rl_diloco import DiLoCoUpdates, OuterVersionLearner
from training.rl_run import RLDiLoCoConfig
from training.rl_trainer import RLTrainer
from verification.rl_roles import start_rl_trainer

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]

WORKER = key("worker")
WORKER_PEER = peer_id_from_private_key(WORKER)
CONFIG = tiny_run(None, async_level=4)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackNodes]:
    nodes = LoopbackNodes(tmp_path_factory.mktemp("rl-restart"), CONFIG.run_id)
    try:
        yield nodes
    finally:
        nodes.close()


def _lone_diloco(policy: CausalLM, grpo: GRPOConfig, version: int) -> PolicyUpdates:
    """DiLoCo with H=1 and no other trainer: every GRPO step is an outer step, with outer momentum."""
    learner = OuterVersionLearner(policy, grpo, inner_steps=1, outer_version=version)
    return DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=1), LoneAverager())


def _start(
    nodes: LoopbackNodes, name: str, checkpoint_dir: Path, updates: UpdatesFactory = every_step_updates
) -> tuple[RLTrainer, FakeJudge]:
    node = nodes.add(name, [Role.TRAINER, Role.VALIDATOR])
    judge = FakeJudge(node, CONFIG.run_id, lambda worker, group: True)
    # a fresh random policy: whatever it resumes must come from the checkpoint
    trainer = RLTrainer(node, CONFIG, judge, TinyGPT(TINY), checkpoint_dir=checkpoint_dir, updates=updates)
    return trainer.start(), judge


def _stop(nodes: LoopbackNodes, trainer: RLTrainer) -> None:
    trainer.stop()
    nodes.stop(trainer.node)


def _submit(trainer: RLTrainer, group: RolloutGroup) -> None:
    submit_to_intake(trainer, group, WORKER)


def _assert_same_moments(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert left["state"].keys() == right["state"].keys() and right["state"]
    for index, entry in right["state"].items():
        assert_state_dicts_equal(left["state"][index], entry)


def _published_state(trainer: RLTrainer, version: int) -> dict[str, torch.Tensor]:
    return trainer.node.call(trainer.broadcast.load(CONFIG.run_id, version), timeout_s=30)


def test_a_restarted_trainer_resumes_from_its_checkpoint_and_republishes_it(
    nodes: LoopbackNodes, tmp_path: Path
) -> None:
    trainer, _ = _start(nodes, "trainer-a", tmp_path)
    for counter in range(2):
        _submit(trainer, fake_group(counter))
    assert wait_until(lambda: trainer.version == 2 and 2 in trainer.published_at, 60.0)
    state = trainer.learner.state_dict()
    moments = optimizer_state(trainer.learner.optimizer)
    _stop(nodes, trainer)

    restarted, judge = _start(nodes, "trainer-a", tmp_path)
    try:
        assert restarted.version == 2
        assert_state_dicts_equal(restarted.learner.state_dict(), state)
        _assert_same_moments(optimizer_state(restarted.learner.optimizer), moments)
        assert judge.versions == [2] and judge.steps == [2]
        assert 2 in restarted.published_at  # republished, though its store already held it
        assert_state_dicts_equal(_published_state(restarted, 2), state)

        # a group of a version from before the restart (within the async level, but the restarted
        # learner holds only version 2's weights): dropped as stale, never a crash
        _submit(restarted, fake_group(2, version=1))
        assert wait_until(lambda: restarted.stale_dropped == 4 and restarted.settled, 30.0)
        assert restarted.alive and restarted.version == 2 and restarted.reports == []

        _submit(restarted, fake_group(3, version=2))
        assert wait_until(lambda: restarted.version == 3 and 3 in restarted.published_at, 60.0)
        assert_state_dicts_equal(_published_state(restarted, 3), restarted.learner.state_dict())
        # it numbers its steps on from the checkpoint's (its progress lines and `max_trainer_steps` count the run's)
        assert [report.step for report in restarted.reports] == [2]
    finally:
        _stop(nodes, restarted)


def test_a_trainer_that_dies_before_checkpointing_never_republishes_a_version_with_other_weights(
    nodes: LoopbackNodes, tmp_path: Path
) -> None:
    trainer, _ = _start(nodes, "trainer-b", tmp_path)
    assert wait_until(lambda: (tmp_path / "policy.pt").exists(), 30.0)
    (tmp_path / "policy.pt.tmp").mkdir()  # the next checkpoint cannot be written: the trainer dies there
    _submit(trainer, fake_group(0))
    assert wait_until(lambda: not trainer.alive, 60.0)
    _stop(nodes, trainer)
    (tmp_path / "policy.pt.tmp").rmdir()

    restarted, _ = _start(nodes, "trainer-b", tmp_path)
    try:
        assert restarted.version == 0
        _submit(restarted, fake_group(1))  # another group: version 1 now has other weights
        assert wait_until(lambda: 1 in restarted.published_at, 60.0)
        # what the network is given as version 1 is what the trainer (and its validator) hold as 1
        assert_state_dicts_equal(_published_state(restarted, 1), restarted.learner.state_dict())
    finally:
        _stop(nodes, restarted)


def test_a_diloco_trainer_learns_from_rollouts_of_its_newer_outer_versions(
    nodes: LoopbackNodes, tmp_path: Path
) -> None:
    """Rollouts carry outer versions; the trainer once compared them with the learner's internal
    numbers (outer version x (H + 1)) and dropped every group of version 1 or later as stale."""
    trainer, _ = _start(nodes, "trainer-e", tmp_path, updates=_lone_diloco)
    try:
        _submit(trainer, fake_group(20, version=0))
        assert wait_until(lambda: trainer.version == 1, 60.0)
        _submit(trainer, fake_group(21, version=1))
        assert wait_until(lambda: trainer.version == 2 or trainer.stale_dropped > 0, 60.0)
        assert trainer.stale_dropped == 0 and trainer.version == 2
    finally:
        _stop(nodes, trainer)


def test_a_restarted_diloco_trainer_resumes_its_outer_momentum(nodes: LoopbackNodes, tmp_path: Path) -> None:
    trainer, _ = _start(nodes, "trainer-c", tmp_path, updates=_lone_diloco)
    for counter in range(2):
        _submit(trainer, fake_group(10 + counter, version=trainer.version))
        version = counter + 1

        def published(version: int = version) -> bool:
            return trainer.version == version and version in trainer.published_at

        assert wait_until(published, 60.0)
    assert isinstance(trainer.updates, DiLoCoUpdates)
    state = trainer.updates.current_state()
    _stop(nodes, trainer)

    restarted, _ = _start(nodes, "trainer-c", tmp_path, updates=_lone_diloco)
    try:
        assert isinstance(restarted.updates, DiLoCoUpdates)
        assert restarted.version == 2
        assert restarted.updates.state.hash() == state.hash()  # momentum included
    finally:
        _stop(nodes, restarted)

    # a checkpoint written with DiLoCo is not silently resumed without it (its momentum would be lost)
    assert "DiLoCo settings" in _refusal(nodes, "trainer-c", tmp_path)


def test_a_rollout_accepted_before_a_restart_is_refused_as_a_replay_after_it(
    nodes: LoopbackNodes, tmp_path: Path
) -> None:
    config = tiny_run(None, async_level=4, groups_per_step=2)  # no step: the restart resumes version 0
    worker = ScriptedWorker(nodes.add("replayer", [Role.INFERENCE]), config)
    trainers: list[RLTrainer] = []

    def start() -> tuple[RLTrainer, LiveNode]:
        node = nodes.add("trainer-f", [Role.TRAINER, Role.VALIDATOR])
        trainer, _ = start_rl_trainer(node, config, TinyGPT(TINY), checkpoint_dir=tmp_path)
        trainers.append(trainer)
        return trainer, worker.validator(node.identity.peer_id_bytes)

    def group_for_next_ticket(trainer: RLTrainer, validator: LiveNode) -> RolloutGroup:
        [ticket] = worker.tickets(validator, version=0)
        return honest_group(policy_at(trainer, 0), config, worker.peer, ticket)

    try:
        trainer, validator = start()
        first = group_for_next_ticket(trainer, validator)
        assert all(v.accepted for v in worker.submit(validator, worker.seal(first)))
        _stop(nodes, trainer)

        restarted, validator = start()
        copied = group_for_next_ticket(restarted, validator)
        copied.rollouts[1] = first.rollouts[0]  # in another assignment: only the replay memory knows it
        verdicts = worker.submit(validator, worker.seal(copied))
        assert [v.reason for v in verdicts] == ["replay"] * 4
    finally:
        for trainer in trainers:
            if trainer.node in nodes.nodes:
                _stop(nodes, trainer)
        worker.close()


def test_a_corrupt_checkpoint_is_a_clear_error(nodes: LoopbackNodes, tmp_path: Path) -> None:
    (tmp_path / "policy.pt").write_bytes(b"not a checkpoint")
    assert "move it away" in _refusal(nodes, "trainer-d", tmp_path)


def _refusal(nodes: LoopbackNodes, name: str, checkpoint_dir: Path) -> str:
    """The CheckpointError a trainer started on `checkpoint_dir` refuses to start with."""
    node = nodes.add(name, [Role.TRAINER, Role.VALIDATOR])
    try:
        judge = FakeJudge(node, CONFIG.run_id, lambda worker, group: True)
        with pytest.raises(CheckpointError) as refused:
            RLTrainer(node, CONFIG, judge, TinyGPT(TINY), checkpoint_dir=checkpoint_dir)
    finally:
        nodes.stop(node)
    return str(refused.value)
