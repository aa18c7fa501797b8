"""An RL run by hand, as the README's commands start it: a seed, `hivenet join --role trainer --rl`
and an inference worker, each its own process. The trainer is killed with SIGKILL mid-run and
started again with the same command: it resumes at the version it had checkpointed (by default,
in its own state directory), and the run goes on past it with the same worker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.identity import create_identity
from node.swarm import LocalSwarm, wait_until

STEP = re.compile(r"step +\d+ \| v(\d+) \|")


def _versions(log: str) -> list[int]:
    return [int(v) for v in STEP.findall(log)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_rl_trainer_resumes_at_its_version_and_the_run_goes_on(tmp_path: Path) -> None:
    with LocalSwarm(run_id="rl-restart", workdir=tmp_path) as swarm:
        swarm.start_seed()
        trainer_key = tmp_path / "trainer.key"
        trainer_id = create_identity(trainer_key).peer_id.to_base58()
        run_options = ["--group-size", "4"]  # every node of an RL run takes the run's RL options
        trainer_args = ["--rl", *run_options]
        swarm.add_node(name="trainer", roles=["trainer"], identity_path=trainer_key, extra_args=trainer_args)
        swarm.add_node(
            name="worker", roles=["inference"], extra_args=["--publisher", trainer_id, *run_options]
        )
        trainer, worker = swarm.nodes["trainer"], swarm.nodes["worker"]
        assert wait_until(lambda: max(_versions(trainer.log_tail(400)), default=0) >= 3, 300), (
            trainer.log_tail()
        )
        swarm.kill_node("trainer")
        killed_at = max(_versions(trainer.log_tail(400)))
        assert (tmp_path / "trainer-state" / "checkpoints" / "rl-restart").is_dir()

        swarm.add_node(name="trainer", roles=["trainer"], identity_path=trainer_key, extra_args=trainer_args)
        restarted = swarm.nodes["trainer"]
        assert wait_until(lambda: max(_versions(restarted.log_tail(400)), default=0) > killed_at + 1, 300), (
            restarted.log_tail(60),
            worker.log_tail(30),
        )
        versions = _versions(restarted.log_tail(400))
        assert min(versions) > killed_at - 1, versions  # it went on from its checkpoint, not from v0
        assert worker.alive and trainer is not restarted
