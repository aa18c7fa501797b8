"""An RL run by hand, as the README's commands start it: a seed, `hivenet join --role trainer --rl`
a standalone validator and an inference worker, each its own process. The trainer is killed with
SIGKILL mid-run and started again with the same command: it resumes at the version it had
checkpointed (by default, in its own state directory), and the run goes on past it with the same
worker and validator, without a human."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.identity import create_identity
from node.swarm import LocalSwarm, wait_until

STEP = re.compile(r"step +\d+ \| v(\d+) \|")
STEP_NUMBER = re.compile(r"step +(\d+) \| v\d+ \|")
ACCEPTED = re.compile(r"group +\d+ \| v(\d+) \| accepted [1-9]\d* \|.* validator (\S+)")


def _versions(log: str) -> list[int]:
    return [int(v) for v in STEP.findall(log)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_rl_trainer_resumes_at_its_version_and_the_run_goes_on(tmp_path: Path) -> None:
    with LocalSwarm(run_id="rl-restart", workdir=tmp_path) as swarm:
        swarm.start_seed()
        trainer_key = tmp_path / "trainer.key"
        trainer_id = create_identity(trainer_key).peer_id.to_base58()
        validator_key = tmp_path / "validator.key"
        validator_id = create_identity(validator_key).peer_id.to_base58()
        # every node of an RL run takes the run's RL options
        run_options = ["--group-size", "4", "--trusted-validator", validator_id]
        trainer_args = ["--rl", *run_options]
        swarm.add_node(name="trainer", roles=["trainer"], identity_path=trainer_key, extra_args=trainer_args)
        swarm.add_node(
            name="validator",
            roles=["validator"],
            identity_path=validator_key,
            extra_args=["--rl", "--publisher", trainer_id, *run_options],
        )
        swarm.add_node(
            name="worker", roles=["inference"], extra_args=["--publisher", trainer_id, *run_options]
        )
        trainer, validator, worker = (swarm.nodes[n] for n in ("trainer", "validator", "worker"))
        assert wait_until(lambda: max(_versions(trainer.log_tail(400)), default=0) >= 3, 300), (
            trainer.log_tail()
        )
        swarm.kill_node("trainer")
        killed_at = max(_versions(trainer.log_tail(400)))
        killed_after_step = max(int(s) for s in STEP_NUMBER.findall(trainer.log_tail(400)))
        assert (tmp_path / "trainer-state" / "checkpoints" / "rl-restart").is_dir()

        swarm.add_node(name="trainer", roles=["trainer"], identity_path=trainer_key, extra_args=trainer_args)
        restarted = swarm.nodes["trainer"]
        assert wait_until(lambda: max(_versions(restarted.log_tail(400)), default=0) > killed_at + 1, 300), (
            restarted.log_tail(60),
            worker.log_tail(30),
        )
        versions = _versions(restarted.log_tail(400))
        assert min(versions) > killed_at - 1, versions  # it went on from its checkpoint, not from v0
        steps = [int(s) for s in STEP_NUMBER.findall(restarted.log_tail(400))]
        assert min(steps) >= killed_after_step - 1, steps  # and numbers its steps on, not from 0
        # the standalone validator went on too: it judged groups of the restarted trainer's versions
        standalone = validator_id[-8:]
        assert wait_until(
            lambda: any(
                int(v) > killed_at and who == standalone for v, who in ACCEPTED.findall(worker.log_tail(400))
            ),
            300,
        ), (worker.log_tail(30), validator.log_tail(30))
        assert worker.alive and validator.alive and trainer is not restarted
