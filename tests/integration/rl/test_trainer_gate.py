"""The trainer learns only from what a validator accepted, and from each group once.

One real trainer node (its broadcast publishes every version) with a fake judge that accepts
the groups a test picks. Groups enter through the trainer's own intake handler (what the submit
stream calls once the transport has checked the envelope) and through its forward handler
(what a trusted standalone validator's forward reaches once every signature was re-checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import PeerID

from node.swarm import wait_until
from protocol.node_record import Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollout_messages import open_forward, open_group, seal_forward, seal_group
from protocol.rollouts_pb2 import RolloutGroup
from tests.helpers.rl_loop import (
    TINY,
    FakeJudge,
    LoopbackNodes,
    assert_steps_settle_at,
    fake_group,
    tiny_run,
)
from tests.helpers.rollouts import key, verdicts_for
from training.model import TinyGPT
from training.rl_run import RLRunConfig
from training.rl_trainer import RLTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORKER = key("worker")
WORKER_PEER = peer_id_from_private_key(WORKER)
OTHER_VALIDATOR = key("standalone validator")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackNodes]:
    nodes = LoopbackNodes(tmp_path_factory.mktemp("rl-gate"), "rl-test")
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def node_name(request: pytest.FixtureRequest) -> str:
    return f"trainer-{request.node.name[:40]}"


def _trainer(
    nodes: LoopbackNodes, name: str, config: RLRunConfig, judge_accepts: Callable[[bytes, RolloutGroup], bool]
) -> tuple[RLTrainer, FakeJudge]:
    node = nodes.add(name, [Role.TRAINER, Role.VALIDATOR])
    judge = FakeJudge(node, config.run_id, judge_accepts)
    return RLTrainer(node, config, judge, TinyGPT(TINY)).start(), judge


def _submit(trainer: RLTrainer, group: RolloutGroup) -> list[bytes]:
    """Hand `group` to the trainer as its submit stream does after the transport's checks."""
    sealed = _sealed(trainer.config, group)
    envelope, opened = open_group(sealed, run_id=trainer.config.run_id)

    async def judged() -> list[bytes]:
        return await trainer.intake.handler(WORKER_PEER, envelope, opened)

    return trainer.node.call(judged(), timeout_s=30)


def _sealed(config: RLRunConfig, group: RolloutGroup) -> bytes:
    return seal_group(WORKER, run_id=config.run_id, group=group, seq=int(group.counter))


def _forward(trainer: RLTrainer, group: RolloutGroup) -> None:
    """Hand `group` to the trainer as a forward of a trusted validator that accepted it."""
    assert trainer.forwards is not None
    sealed_group = _sealed(trainer.config, group)
    verdicts = verdicts_for(OTHER_VALIDATOR, WORKER_PEER, group, run_id=trainer.config.run_id)
    validator = peer_id_from_private_key(OTHER_VALIDATOR)
    sealed = seal_forward(
        OTHER_VALIDATOR, run_id=trainer.config.run_id, sealed_group=sealed_group, sealed_verdicts=verdicts
    )
    forwarded = open_forward(sealed, run_id=trainer.config.run_id, validator=validator)
    handler = trainer.forwards.handler

    async def taken() -> None:
        await handler(validator, forwarded)

    trainer.node.call(taken(), timeout_s=30)


def test_a_trainer_whose_validator_rejects_everything_never_steps(
    nodes: LoopbackNodes, node_name: str
) -> None:
    trainer, judge = _trainer(nodes, node_name, tiny_run(None), lambda worker, group: False)
    try:
        for counter in range(6):
            _submit(trainer, fake_group(counter))
        # each submission returns once judged: nothing reached the training loop, so it cannot step
        assert len(judge.rejected_hashes) == 6 * 4 and trainer.groups_delivered == 0
        assert wait_until(lambda: trainer.settled, 60.0)
        assert trainer.reports == [] and trainer.version == 0
        assert trainer.trained_hashes == set() and not trainer.trained_from
    finally:
        trainer.stop()


def test_the_trainer_trains_on_exactly_the_accepted_groups(nodes: LoopbackNodes, node_name: str) -> None:
    config = tiny_run(None, groups_per_step=2, async_level=4)
    trainer, judge = _trainer(nodes, node_name, config, lambda worker, group: group.counter % 2 == 0)
    try:
        for counter in range(8):
            _submit(trainer, fake_group(counter))
        assert_steps_settle_at(trainer, 2)
        assert [r.groups for r in trainer.reports] == [2, 2]
        assert [r.version for r in trainer.reports] == [1, 2]
        assert trainer.trained_hashes == judge.accepted_hashes
        assert not trainer.trained_hashes & judge.rejected_hashes
        assert trainer.trained_from == {WORKER_PEER: 16}
        # every version it made was handed to its validator and announced as the staleness reference
        assert judge.versions == [0, 1, 2] and judge.steps == [0, 1, 2]
    finally:
        trainer.stop()


def test_a_group_delivered_twice_is_trained_on_once(nodes: LoopbackNodes, node_name: str) -> None:
    # by its own validator twice, and once more forwarded by a trusted standalone validator
    config = tiny_run(None, async_level=4, trusted_validators=[_base58(OTHER_VALIDATOR)])
    trainer, judge = _trainer(nodes, node_name, config, lambda worker, group: True)
    try:
        group = fake_group(0)
        _submit(trainer, group)
        _submit(trainer, group)
        _forward(trainer, group)
        assert_steps_settle_at(trainer, 1)
        assert trainer.trained_from == {WORKER_PEER: 4}

        # and a group that arrives first by forward, then from the trainer's own validator
        other = fake_group(1)
        _forward(trainer, other)
        _submit(trainer, other)
        assert_steps_settle_at(trainer, 2)
        assert trainer.trained_from == {WORKER_PEER: 8}
        assert trainer.trained_hashes == judge.accepted_hashes
    finally:
        trainer.stop()


def _base58(private_key: Ed25519PrivateKey) -> str:
    return PeerID(peer_id_from_private_key(private_key)).to_base58()
