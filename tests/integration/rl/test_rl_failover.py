"""Two validators in one run: the trainer's own and a standalone validator node it trusts.

- A group judged by one is refused by the other (tickets are a validator's own: replaying a group
  at a second validator of the run earns nothing), and the one trainer it is forwarded to trains
  on it once and signs the standalone validator one validation receipt for it, which both keep.
- A worker submits only to those two, never to a third node that claims the validator role.
- A real inference worker spreads its groups over both; when the standalone validator stops
  answering (its node still listed in membership), the worker fails over to the trainer's
  validator and keeps getting verdicts, and the trainer keeps stepping.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from node.identity import create_identity
from node.ledger import Ledger
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.receipts import Receipt, ReceiptKind
from protocol.rollout_messages import parse_rollout, rollout_hash
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
from training.rl_worker import InferenceWorker
from verification.rl_roles import StandaloneValidator, start_rl_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _validations(ledger: Ledger, evidence: bytes) -> list[Receipt]:
    """The validation receipts in `ledger` for the group of sha256 `evidence`."""
    return [r for r in ledger.receipts() if r.kind is ReceiptKind.VALIDATION and r.evidence == evidence]


def _holds_validation(ledger: Ledger, evidence: bytes) -> bool:
    return bool(_validations(ledger, evidence))


@dataclass
class TwoValidators:
    nodes: LoopbackNodes
    config: RLRunConfig
    policy_v0: TinyGPT
    trainer: RLTrainer
    standalone: StandaloneValidator


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoValidators]:
    root = tmp_path_factory.mktemp("rl-failover")
    trainer_id = create_identity(root / "trainer.key").peer_id.to_base58()
    validator_id = create_identity(root / "validator.key").peer_id.to_base58()
    config = tiny_run(
        None, async_level=4, authorized_publishers=[trainer_id], trusted_validators=[validator_id]
    )
    nodes = LoopbackNodes(root, config.run_id)
    trainer = None
    try:
        policy = TinyGPT(TINY)
        policy_v0 = copy.deepcopy(policy).eval()
        trainer, _ = start_rl_trainer(
            nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR], ledger=True), config, policy
        )
        standalone = StandaloneValidator(
            nodes.add("validator", [Role.VALIDATOR], ledger=True), config
        ).start()
        yield TwoValidators(nodes, config, policy_v0, trainer, standalone)
    finally:
        if trainer is not None:
            trainer.stop()
        nodes.close()


def test_a_group_judged_by_one_validator_is_refused_by_the_other_and_trained_on_once(
    run: TwoValidators,
) -> None:
    scripted = ScriptedWorker(run.nodes.add("scripted", [Role.INFERENCE]), run.config)
    try:
        assert wait_until(lambda: 0 in run.standalone.validator.held_versions, 60.0, interval_s=0.5)
        own = scripted.validator(run.trainer.node.identity.peer_id_bytes)
        other = scripted.validator(run.standalone.node.identity.peer_id_bytes)
        ticket = scripted.tickets(other, version=0)[0]
        assert ticket.policy_version == 0
        group = honest_group(run.policy_v0, run.config, scripted.peer, ticket)
        sealed = scripted.seal(group)

        assert all(v.accepted for v in scripted.submit(other, sealed))
        assert wait_until(
            lambda: run.trainer.forwards is not None and run.trainer.forwards.forwards_accepted >= 1, 30.0
        )
        assert_steps_settle_at(run.trainer, 1)
        # the same group replayed at the trainer's own validator: no ticket of its own, nothing judged
        assert {v.reason for v in scripted.submit(own, sealed)} == {"no_ticket"}
        assert_steps_settle_at(run.trainer, 1)
        assert run.trainer.trained_from[scripted.peer] == 4
        assert {rollout_hash(r) for r in group.rollouts} <= run.trainer.trained_hashes
        # the trainer signed the standalone validator one receipt for the group; each keeps it
        trainer_id = run.trainer.node.identity.peer_id_bytes
        validator_id = run.standalone.node.identity.peer_id_bytes
        evidence = hashlib.sha256(sealed).digest()
        tokens = sum(len(parse_rollout(raw).completion_ids) for raw in group.rollouts)
        for ledger in (run.standalone.node.ledger, run.trainer.node.ledger):
            assert ledger is not None
            assert wait_until(functools.partial(_holds_validation, ledger, evidence), 30.0)
            [receipt] = _validations(ledger, evidence)
            assert (receipt.signer, receipt.contributor) == (trainer_id, validator_id)
            assert (receipt.count, receipt.tokens) == (4, tokens)
        assert wait_until(
            lambda: run.standalone.node.metrics.figures().tokens.get("validator", 0) >= tokens, 10.0
        )
    finally:
        scripted.close()


def test_a_group_accepted_while_the_trainer_refuses_forwards_is_trained_on_once_it_takes_them(
    run: TwoValidators, caplog: pytest.LogCaptureFixture
) -> None:
    scripted = ScriptedWorker(run.nodes.add("scripted-q", [Role.INFERENCE]), run.config)
    forwards = run.trainer.forwards
    assert forwards is not None
    try:
        assert wait_until(lambda: 0 in run.standalone.validator.held_versions, 60.0, interval_s=0.5)
        other = scripted.validator(run.standalone.node.identity.peer_id_bytes)
        version = max(run.standalone.validator.held_versions)
        ticket = scripted.tickets(other, version=version)[0]
        policy = policy_at(run.trainer, version)
        group = honest_group(policy, run.config, scripted.peer, ticket)
        run.trainer.node.call(forwards.stop())  # the trainer takes no forward for now
        queue = run.standalone.forwards
        retries = queue.retries

        assert all(v.accepted for v in scripted.submit(other, scripted.seal(group)))  # queued durably
        caplog.set_level(logging.DEBUG, logger="verification.rl_roles")
        assert wait_until(lambda: queue.retries > retries + 1, 60.0), "the forward was never tried again"
        assert len(queue) == 1 and scripted.peer not in run.trainer.trained_from
        failures = [r for r in caplog.records if "could not forward" in r.getMessage()]
        assert (
            len(failures) >= 2 and [r.levelno for r in failures].count(logging.WARNING) == 1
        )  # one line per trainer

        run.trainer.node.call(forwards.start())  # it takes forwards again: the queue's next try lands
        assert wait_until(lambda: len(queue) == 0, 120.0), "the queued group never reached the trainer"
        assert wait_until(lambda: run.trainer.trained_from.get(scripted.peer, 0) == 4, 60.0)
        assert {rollout_hash(r) for r in group.rollouts} <= run.trainer.trained_hashes
    finally:
        scripted.close()


def test_a_worker_never_submits_to_a_validator_the_run_does_not_trust(run: TwoValidators) -> None:
    # a node anyone can start: it claims the validator role and would judge (or swallow) what it gets
    rogue = StandaloneValidator(run.nodes.add("rogue", [Role.VALIDATOR]), run.config).start()
    worker = InferenceWorker(run.nodes.add("worker-r", [Role.INFERENCE]), run.config).start()
    rogue_peer = rogue.node.identity.peer_id
    try:
        assert wait_until(
            lambda: any(v.peer_id == rogue_peer for v in worker.node.discover(Role.VALIDATOR)),
            60.0,
            interval_s=0.5,
        ), "the worker never saw the rogue validator: the test would prove nothing"
        seen = len(worker.reports)
        assert wait_until(lambda: len(worker.reports) >= seen + 6, 120.0, interval_s=0.5)
        trusted = {run.trainer.node.short_id, run.standalone.node.short_id}
        assert {r.validator for r in worker.reports} <= trusted
        assert not rogue.validator.stats().workers  # nothing was ever submitted to it
    finally:
        worker.stop()


def test_a_worker_fails_over_when_a_validator_stops_answering(run: TwoValidators) -> None:
    worker_node = run.nodes.add("worker", [Role.INFERENCE])
    worker = InferenceWorker(worker_node, run.config).start()
    own = run.trainer.node.short_id
    standalone = run.standalone.node.short_id
    try:
        judged_by = lambda: {r.validator for r in worker.reports if not r.error}  # noqa: E731
        assert wait_until(lambda: judged_by() >= {own, standalone}, 120.0, interval_s=0.5), judged_by()

        # the validator dies (it neither issues tickets nor judges); its record stays
        run.standalone.node.call(run.standalone.intake.stop())
        run.standalone.node.call(run.standalone.tickets.stop())
        killed_at = len(worker.reports)
        steps_at = len(run.trainer.reports)
        assert wait_until(lambda: len(worker.reports) >= killed_at + 4, 120.0, interval_s=0.5)
        assert wait_until(lambda: len(run.trainer.reports) >= steps_at + 2, 60.0, interval_s=0.5)

        # the groups of the dead validator's tickets in hand when it died are lost (its tickets are
        # good there only); every later one was judged by the trainer's own validator
        in_hand = run.config.groups_per_submission
        after = worker.reports[killed_at + in_hand :]
        assert after and all(r.validator == own and not r.error for r in after), [r.describe() for r in after]
        assert not {reason for r in worker.reports for reason in r.rejected} - {"stale"}
        assert run.trainer.alive
        worker.stop()
        run.trainer.stop()  # settles its counts: a step adds its hashes before its report
        # nothing trained twice: every trained rollout is a distinct accepted one
        assert sum(r.rollouts for r in run.trainer.reports) == len(run.trainer.trained_hashes)
    finally:
        worker.stop()
