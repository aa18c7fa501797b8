"""An RL trainer that receives no group says why, once each time that changes: no inference worker
is live (with the command that starts one), or workers are live but none of their groups arrives.
Before, a lone trainer printed nothing but "contributed: nothing yet" until a worker came."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node.swarm import wait_until
from protocol.node_record import Role
from tests.helpers.rl_loop import (
    TINY,
    FakeJudge,
    LoopbackNodes,
    fake_group,
    loopback_nodes,
    submit_to_intake,
    tiny_run,
)
from tests.helpers.rollouts import key
from training.model import TinyGPT
from training.rl_trainer import RLTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = tiny_run(None, async_level=4)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[LoopbackNodes]:
    with loopback_nodes(tmp_path, CONFIG.run_id) as nodes:
        yield nodes


def test_a_trainer_without_groups_says_what_it_waits_for_and_when_it_stops(nodes: LoopbackNodes) -> None:
    node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR])
    trainer = RLTrainer(
        node, CONFIG, FakeJudge(node, CONFIG.run_id, lambda worker, group: True), TinyGPT(TINY)
    )
    trainer.idle_report_s = 0.2
    trainer.start()
    try:
        assert wait_until(lambda: trainer.waiting_for is not None, 30.0)
        reason = trainer.waiting_for or ""
        assert "no inference worker" in reason and node.identity.peer_id.to_base58() in reason, reason

        nodes.add("worker", [Role.INFERENCE])  # live, but it submits nothing
        assert wait_until(lambda: "1 inference worker(s) live" in (trainer.waiting_for or ""), 30.0)

        submit_to_intake(trainer, fake_group(0), key("worker"))
        assert wait_until(lambda: trainer.waiting_for is None, 30.0)
    finally:
        trainer.stop()
