"""Two RL trainers training one policy with DiLoCo on real nodes: receipts and interchangeable publications.

Each trainer has a fake judge (groups enter through its intake handler) and averages over the
real DHT and averaging transport (`training.rl_diloco.node_diloco_updates`, what
`verification.rl_roles.start_rl_trainer` uses). After their common outer step:
- each trainer's ledger holds a verified training receipt it signed for the other, stating the
  run config's tokens per outer step (never a figure the other claimed);
- both publish the new version with the same content and serve its chunks, and both are
  announced as its holders: a fetcher of either publication can take chunks from both.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pytest

from node.identity import create_identity
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.receipts import Receipt, ReceiptKind
from protocol.rollout_messages import open_group, seal_group
from protocol.rollouts_pb2 import RolloutGroup
from tests.helpers.rl_loop import TINY, FakeJudge, LoopbackNodes, fake_group, tiny_run
from tests.helpers.rollouts import key
from training.model import TinyGPT
from training.rl_diloco import DiLoCoUpdates, node_diloco_updates, rl_tokens_per_outer_step
from training.rl_run import RLDiLoCoConfig, RLRunConfig
from training.rl_trainer import RLTrainer

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

WORKER = key("worker")
NAMES = ("trainer-a", "trainer-b")


@dataclass
class TwoTrainers:
    nodes: LoopbackNodes
    config: RLRunConfig
    trainers: list[RLTrainer]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoTrainers]:
    root = tmp_path_factory.mktemp("rl-diloco-publishers")
    publishers = [create_identity(root / f"{name}.key").peer_id.to_base58() for name in NAMES]
    config = tiny_run(
        None,
        async_level=2,
        authorized_publishers=publishers,
        diloco=RLDiLoCoConfig(inner_steps=1, averaging_timeout_s=120.0),
    )
    nodes = LoopbackNodes(root, config.run_id)
    trainers: list[RLTrainer] = []
    try:
        policy = TinyGPT(TINY)
        for name in NAMES:
            node = nodes.add(name, [Role.TRAINER, Role.VALIDATOR], ledger=True)
            judge = FakeJudge(node, config.run_id, lambda worker, group: True)
            trainer = RLTrainer(
                node, config, judge, copy.deepcopy(policy), updates=node_diloco_updates(node, config)
            )
            trainers.append(trainer.start())
        for counter, trainer in enumerate(trainers):  # other rollouts on each trainer
            _submit(trainer, config, fake_group(counter))
        assert wait_until(lambda: all(1 in t.published_at for t in trainers), 180.0, interval_s=0.5)
        yield TwoTrainers(nodes, config, trainers)
    finally:
        for trainer in trainers:
            trainer.stop()
        nodes.close()


def _submit(trainer: RLTrainer, config: RLRunConfig, group: RolloutGroup) -> None:
    sealed = seal_group(WORKER, run_id=config.run_id, group=group, seq=int(group.counter))
    envelope, opened = open_group(sealed, run_id=config.run_id)
    worker = envelope.signer

    async def judged() -> list[bytes]:
        return await trainer.intake.handler(worker, envelope, opened)

    trainer.node.call(judged(), timeout_s=30)


def _signed_training_receipts(trainer: RLTrainer) -> list[Receipt]:
    """The training receipts in the trainer's ledger that the trainer signed itself."""
    ledger = trainer.node.ledger
    assert ledger is not None
    own = trainer.node.identity.peer_id_bytes
    return [r for r in ledger.receipts() if r.kind == ReceiptKind.TRAINING and r.signer == own]


def _signed_any(trainer: RLTrainer) -> bool:
    return bool(_signed_training_receipts(trainer))


def test_the_outer_step_averaged_both_trainers(pair: TwoTrainers) -> None:
    for trainer in pair.trainers:
        assert isinstance(trainer.updates, DiLoCoUpdates)
        assert [(r.version, r.num_peers) for r in trainer.updates.records] == [(1, 2)]
    first, second = (t.updates for t in pair.trainers)
    assert isinstance(first, DiLoCoUpdates) and isinstance(second, DiLoCoUpdates)
    assert first.records[0].state_hash == second.records[0].state_hash


def test_each_trainer_signs_a_training_receipt_for_the_other(pair: TwoTrainers) -> None:
    tokens = rl_tokens_per_outer_step(pair.config)
    assert tokens == 1 * 1 * 4 * 38  # H x groups per step x group size x the task's completion budget
    for trainer, other in (pair.trainers, pair.trainers[::-1]):
        assert wait_until(partial(_signed_any, trainer), 30.0, interval_s=0.5)
        (receipt,) = _signed_training_receipts(trainer)  # the ledger keeps only receipts it verified
        assert receipt.contributor == other.node.identity.peer_id_bytes
        assert receipt.run_id == pair.config.run_id
        assert receipt.step == 0  # the outer step whose pseudo-gradients the round averaged
        assert receipt.tokens == tokens
        assert receipt.byte_count > 0
        assert len(receipt.evidence) > 0  # the averaging group's id


def test_both_trainers_serve_the_same_content_for_the_new_version(pair: TwoTrainers) -> None:
    run_id = pair.config.run_id
    manifests = [t.manifests[1] for t in pair.trainers]
    assert [m.publisher for m in manifests] == [t.node.identity.peer_id_bytes for t in pair.trainers]
    content_id = manifests[0].content_id
    assert manifests[1].content_id == content_id
    assert manifests[0].chunk_hashes == manifests[1].chunk_hashes
    for trainer in pair.trainers:
        offered = {(e.run_id, e.version): e for e in trainer.broadcast.service.offered()}
        entry = offered[(run_id, 1)]
        assert entry.complete and entry.manifest.content_id == content_id
    # a fetcher of either publication finds both trainers as holders of that content
    everyone = {t.node.identity.peer_id for t in pair.trainers}
    for trainer in pair.trainers:

        def holders(trainer: RLTrainer = trainer) -> set[object]:
            found = trainer.node.call(trainer.broadcast.records.find_holders(run_id, 1, content_id))
            return {h.peer_id for h in found if h.chunks_held == h.num_chunks}

        assert wait_until(lambda: holders() >= everyone, 30.0, interval_s=0.5), holders()
