"""Faults that cross the whole loop: a worker that dies mid-submission, a replayed group, a group without
a ticket, a stolen group.

A seed, a trainer with its own validator, and scripted workers that ask for tickets, generate the
honest group of each with the policy version it names and submit it over the real protocols, or
misbehave in one precise way. Each fault must get a clear rejection (or no verdict at all),
leave the trainer running, and never be trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from node.membership import LiveNode
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.rollout_messages import rollout_hash
from protocol.rollouts_pb2 import RolloutGroup, Ticket
from tests.helpers.rl_loop import (
    TINY,
    LoopbackNodes,
    ScriptedWorker,
    assert_steps_settle_at,
    honest_group,
    policy_at,
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
        trainer_node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR])
        trainer, validator = start_rl_trainer(trainer_node, config, policy)
        workers = [ScriptedWorker(nodes.add(n, [Role.INFERENCE]), config) for n in ("worker", "other")]
        yield Loop(config, trainer, validator, *workers)
    finally:
        if trainer is not None:
            trainer.stop()
        for worker in workers:
            worker.close()
        nodes.close()


def _ticketed(loop: Loop, worker: ScriptedWorker, validator: LiveNode) -> tuple[Ticket, RolloutGroup]:
    """The worker's next open ticket at the trainer's validator and the honest group for it."""
    ticket = worker.tickets(validator, version=loop.trainer.version)[0]
    policy = policy_at(loop.trainer, int(ticket.policy_version))
    return ticket, honest_group(policy, loop.config, worker.peer, ticket)


def test_a_worker_that_dies_mid_submission_leaves_the_loop_running(loop: Loop) -> None:
    validator = loop.worker.validator(loop.trainer.node.identity.peer_id_bytes)
    _, group = _ticketed(loop, loop.worker, validator)
    steps = len(loop.trainer.reports)
    ended = loop.trainer.intake.streams_ended

    loop.worker.submit_cut_short(validator, loop.worker.seal(group))
    assert wait_until(lambda: loop.trainer.intake.streams_ended > ended, 60.0), "the stream was never closed"
    loop.trained_steps(steps)
    assert loop.trainer.alive
    assert loop.validator.stats().workers[loop.worker.peer].groups == 0  # nothing of it was judged

    # the worker comes back and submits the same ticket's group whole: it is judged and trained on once
    verdicts = loop.worker.submit(validator, loop.worker.seal(group))
    assert [v.accepted for v in verdicts] == [True] * 4
    loop.trained_steps(steps + 1)
    assert {rollout_hash(r) for r in group.rollouts} <= loop.trainer.trained_hashes

    # and another worker's next group is judged as well
    _, other = _ticketed(loop, loop.other, validator)
    assert all(v.accepted for v in loop.other.submit(validator, loop.other.seal(other)))
    loop.trained_steps(steps + 2)


def test_a_replayed_group_gets_replay_verdicts_and_is_trained_on_once(loop: Loop) -> None:
    validator = loop.other.validator(loop.trainer.node.identity.peer_id_bytes)
    _, group = _ticketed(loop, loop.other, validator)
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


def test_a_group_without_a_ticket_is_refused_and_uses_nothing_up(loop: Loop) -> None:
    validator = loop.other.validator(loop.trainer.node.identity.peer_id_bytes)
    steps = len(loop.trainer.reports)
    version = loop.trainer.version
    unissued = Ticket(counter=10_000, policy_version=version, nonce=bytes(16))
    group = honest_group(policy_at(loop.trainer, version), loop.config, loop.other.peer, unissued)

    verdicts = loop.other.submit(validator, loop.other.seal(group))
    assert [v.reason for v in verdicts] == ["no_ticket"] * 4
    loop.trained_steps(steps)
    assert loop.trainer.alive and loop.validator.stats().workers[loop.other.peer].strikes == 0
    # the worker asks for a ticket, as it should have: that group is judged
    _, honest = _ticketed(loop, loop.other, validator)
    assert all(v.accepted for v in loop.other.submit(validator, loop.other.seal(honest)))
    loop.trained_steps(steps + 1)


def test_a_group_submitted_under_another_workers_identity_is_refused(loop: Loop) -> None:
    # `worker` submits, sealed as its own and relabelled with its own open ticket, the group
    # generated for `other`'s next ticket
    validator = loop.worker.validator(loop.trainer.node.identity.peer_id_bytes)
    _, stolen = _ticketed(loop, loop.other, validator)
    own = loop.worker.tickets(validator, version=int(stolen.policy_version))[0]
    stolen.counter, stolen.policy_version = own.counter, own.policy_version
    steps = len(loop.trainer.reports)

    verdicts = loop.worker.submit(validator, loop.worker.seal(stolen))
    assert not any(v.accepted for v in verdicts)
    assert {v.reason for v in verdicts} - {"group_rejected"} <= {"prompt_mismatch", "seed_mismatch"}
    loop.trained_steps(steps)
    assert loop.trainer.alive
    assert not {rollout_hash(r) for r in stolen.rollouts} & loop.trainer.trained_hashes
    assert loop.validator.stats().workers[loop.worker.peer].strikes == 1  # it claimed a prompt not its own
