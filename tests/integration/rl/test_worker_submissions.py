"""How an inference worker submits: several groups at once, judged in one batch, tickets of the
newest version both sides hold, and a group a validator could not judge yet (it does not hold the
version) is submitted again, not lost.

A real worker node and a real trainer node whose judge is a `FakeJudge` (the validator's logic is
tested on its own), so each test decides what the judge answers.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from node.identity import create_identity
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.rollout_messages import UNKNOWN_VERSION
from protocol.rollouts_pb2 import RolloutGroup, Ticket
from tests.helpers.rl_loop import TINY, FakeJudge, LoopbackNodes, tiny_run
from training import rl_trainer
from training.causal_lm import CausalLM
from training.model import TinyGPT
from training.rl_run import RLRunConfig
from training.rl_trainer import RLTrainer
from training.rl_worker import InferenceWorker
from training.worker_groups import GeneratedGroup, GroupReport

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackNodes]:
    nodes = LoopbackNodes(tmp_path_factory.mktemp("rl-submit"), "rl-test")
    try:
        yield nodes
    finally:
        nodes.close()


def _config(nodes: LoopbackNodes, groups_per_submission: int) -> RLRunConfig:
    """The trainer never steps (it waits for 50 groups): the worker sees version 0 only, unless a test adds one."""
    trainer_id = create_identity(nodes.root / "trainer.key").peer_id.to_base58()
    return tiny_run(
        None,
        async_level=8,
        groups_per_step=50,
        groups_per_submission=groups_per_submission,
        authorized_publishers=[trainer_id],
    )


def _run(
    nodes: LoopbackNodes, config: RLRunConfig, accept: Callable[[bytes, RolloutGroup], bool | str]
) -> tuple[RLTrainer, FakeJudge, InferenceWorker]:
    trainer_node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR])
    fake = FakeJudge(trainer_node, config.run_id, accept)
    trainer = RLTrainer(trainer_node, config, fake, TinyGPT(TINY)).start()
    worker = InferenceWorker(nodes.add("worker", [Role.INFERENCE]), config, max_groups=6)
    return trainer, fake, worker


def test_groups_submitted_at_once_are_judged_in_one_batch(
    nodes: LoopbackNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long linger: the two groups of a submission meet in one batch however slow this machine is
    monkeypatch.setattr(rl_trainer, "JUDGE_LINGER_S", 5.0)
    config = _config(nodes, groups_per_submission=2)
    seen: list[int] = []
    lock = threading.Lock()

    def accept(worker: bytes, group: RolloutGroup) -> bool:
        with lock:
            seen.append(int(group.counter))
        return True

    trainer, _, worker = _run(nodes, config, accept)
    try:
        worker.start()
        assert wait_until(lambda: len(worker.reports) >= 6, 120.0, interval_s=0.2), worker.reports
        assert [r.counter for r in worker.reports] == list(range(6))
        assert all(r.accepted == 4 and not r.rejected and not r.error for r in worker.reports)
        assert trainer.judging.batches == [2, 2, 2]
        assert sorted(seen) == list(range(6))
    finally:
        worker.stop()
        trainer.stop()


def test_a_worker_asks_for_tickets_of_the_newest_version_the_validator_holds_too(
    nodes: LoopbackNodes,
) -> None:
    config = _config(nodes, groups_per_submission=2)
    trainer, fake, worker = _run(nodes, config, lambda worker, group: True)
    try:
        assert wait_until(lambda: fake.versions == [0], 60.0, interval_s=0.2)
        worker.window.add(1, TinyGPT(TINY).eval())  # the worker holds a version the validator does not yet

        def validator_catches_up(report: GroupReport) -> None:
            # on the worker's thread, after its first submission's reports and before it asks again
            # (a test thread that appended later raced a worker that could use up its 6 groups first)
            if len(worker.reports) == 2:
                fake.versions.append(1)

        worker.on_group = validator_catches_up
        worker.start()
        assert wait_until(lambda: len(worker.reports) >= 4, 120.0, interval_s=0.2), worker.reports
        # first the newest version both hold; once the validator holds version 1 too, that one
        assert [(r.counter, r.version) for r in worker.reports[:4]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
        assert all(r.accepted == 4 for r in worker.reports)
    finally:
        worker.stop()
        trainer.stop()


def test_a_group_refused_as_unknown_version_is_submitted_again_until_judged(nodes: LoopbackNodes) -> None:
    config = _config(nodes, groups_per_submission=1)
    answers: Counter[int] = Counter()
    lock = threading.Lock()

    def not_held_at_first(worker: bytes, group: RolloutGroup) -> bool | str:
        with lock:
            answers[int(group.counter)] += 1
            return True if answers[int(group.counter)] > 1 else UNKNOWN_VERSION

    trainer, _, worker = _run(nodes, config, not_held_at_first)
    try:
        worker.start()
        assert wait_until(lambda: len(worker.reports) >= 3, 120.0, interval_s=0.2), worker.reports
        reports = worker.reports[:3]
        assert all(r.accepted == 4 and not r.rejected and not r.error for r in reports), [
            r.describe() for r in reports
        ]
        assert all(answers[counter] == 2 for counter in range(3)), answers
    finally:
        worker.stop()
        trainer.stop()


def test_a_version_dropped_from_the_window_while_its_tickets_are_worked_on_is_still_used(
    nodes: LoopbackNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that publishes faster than a worker makes a group: newer versions push the tickets'
    version out of the worker's window between its first and its second group. Both are generated
    with it; before, the second ticket lapsed, and the validator handed it back on every request."""
    config = _config(nodes, groups_per_submission=2)
    trainer, _, worker = _run(nodes, config, lambda worker, group: True)
    generate = worker.generate
    pushed = threading.Event()

    def generate_then_push_out(ticket: Ticket, model: CausalLM) -> GeneratedGroup:
        group = generate(ticket, model)
        if not pushed.is_set():
            pushed.set()
            for version in range(1, worker.window.size + 1):
                worker.window.add(version, TinyGPT(TINY).eval())
            assert worker.window.get(0) is None
        return group

    monkeypatch.setattr(worker, "generate", generate_then_push_out)
    try:
        worker.start()
        assert wait_until(lambda: len(worker.reports) >= 2, 120.0, interval_s=0.2), worker.reports
        assert [(r.counter, r.version, r.accepted) for r in worker.reports[:2]] == [(0, 0, 4), (1, 0, 4)]
    finally:
        worker.stop()
        trainer.stop()
