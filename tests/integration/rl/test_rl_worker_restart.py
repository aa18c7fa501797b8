"""An inference worker that dies and comes back continues with its next assignment.

Assignment counters are used once each at a validator: a restarted worker that started again at
counter 0 would have every group it makes refused as a `replay` until it passed its old highest
counter (all that generation wasted). It keeps its next counter next to its weights store. The
validator keeps every verdict it signs in its node's receipts ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node.identity import create_identity
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.receipts import Receipt, ReceiptKind, receipt_id
from tests.helpers.rl_loop import TINY, LoopbackNodes, tiny_run
from training.model import TinyGPT
from training.rl_worker import InferenceWorker
from verification.rl_roles import start_rl_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_restarted_worker_continues_with_its_next_assignment(tmp_path: Path) -> None:
    trainer_id = create_identity(tmp_path / "trainer.key").peer_id.to_base58()
    config = tiny_run(None, async_level=4, authorized_publishers=[trainer_id])
    nodes = LoopbackNodes(tmp_path, config.run_id)
    trainer = None
    workers: list[InferenceWorker] = []
    try:
        trainer_node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR], ledger=True)
        trainer, validator = start_rl_trainer(trainer_node, config, TinyGPT(TINY))
        first = InferenceWorker(nodes.add("worker", [Role.INFERENCE]), config, max_groups=2).start()
        workers.append(first)
        assert wait_until(lambda: not first.alive, 120.0, interval_s=0.5)
        assert [r.accepted for r in first.reports] == [4, 4]
        nodes.stop(first.node)

        again = InferenceWorker(
            nodes.add("worker", [Role.INFERENCE], ledger=True), config, max_groups=2
        ).start()
        workers.append(again)
        assert wait_until(lambda: not again.alive, 120.0, interval_s=0.5)
        assert [r.counter for r in again.reports] == [2, 3]
        assert [r.accepted for r in again.reports] == [4, 4], [r.describe() for r in again.reports]
        stats = validator.stats().workers[again.node.identity.peer_id_bytes]
        assert stats.groups == 4 and stats.abandoned == 0 and not stats.rejected
        # the validator kept every verdict it signed in its node's ledger (what the exchange serves)
        ledger = trainer_node.ledger
        assert ledger is not None

        # (it may also have pulled the worker's transfer receipts for the weights it fetched from it)
        def verdicts() -> list[Receipt]:
            return [r for r in ledger.receipts() if r.kind == ReceiptKind.ROLLOUT]

        assert wait_until(lambda: len(verdicts()) == 16, 30.0)
        kept = verdicts()
        assert all(r.accepted and r.signer == trainer_node.identity.peer_id_bytes for r in kept)
        assert {r.contributor for r in kept} == {again.node.identity.peer_id_bytes}
        # the restarted worker kept the receipts it was given in its own ledger (it may also have pulled the
        # validator's copies of them, and of its first incarnation's, through the receipts exchange)
        own = again.node.ledger
        assert own is not None
        given = {receipt_id(receipt.envelope) for receipt in again.receipts}
        assert len(given) == 8
        assert wait_until(lambda: given <= {r.receipt_id for r in own.receipts()}, 30.0)
    finally:
        for worker in workers:
            worker.stop()
        if trainer is not None:
            trainer.stop()
        nodes.close()
