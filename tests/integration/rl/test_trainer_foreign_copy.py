"""A trainer whose store already holds a version published by another of the run's trainers.

That happens to a node that followed the run (as a worker or validator) before it trains, with
the same weights store. The copy's pointer and manifest are the other trainer's: a trainer that
only re-announced it put a pointer naming another publisher under its own signature (refused
by every reader) and never published the version itself. It must publish its own manifest of
the same content, so that peers trusting only it find the version, and serve its chunks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hivemind.p2p import PeerID

from node.broadcast.config import BroadcastConfig
from node.broadcast.publish import prepare_state_dict
from node.broadcast.store import ChunkStore
from node.swarm import wait_until
from protocol.node_record import Role
from protocol.peer_keys import peer_id_from_private_key
from tests.helpers.rl_loop import TINY, FakeJudge, LoopbackNodes, tiny_run
from tests.helpers.rollouts import key
from training.model import TinyGPT
from training.rl_trainer import RLTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OTHER = key("other-trainer")


def test_a_trainer_publishes_its_own_manifest_of_a_version_another_trainer_published(tmp_path: Path) -> None:
    config = tiny_run(None, authorized_publishers=[PeerID(peer_id_from_private_key(OTHER)).to_base58()])
    policy = TinyGPT(TINY)
    nodes = LoopbackNodes(tmp_path, config.run_id)
    trainer = None
    try:
        node = nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR])
        with ChunkStore(node.config.weights_dir) as store:  # what following the other trainer left there
            theirs = prepare_state_dict(
                store,
                OTHER,
                run_id=config.run_id,
                version=0,
                state_dict={k: v.detach().clone() for k, v in policy.state_dict().items()},
                chunk_bytes=BroadcastConfig(store_dir=node.config.weights_dir).chunk_bytes,
            ).manifest
        judge = FakeJudge(node, config.run_id, lambda worker, group: True)
        trainer = RLTrainer(node, config, judge, policy).start()

        assert 0 in trainer.published_at
        own = trainer.manifests[0]
        assert own.publisher == node.identity.peer_id_bytes != theirs.publisher
        assert own.content_id == theirs.content_id and own.chunk_hashes == theirs.chunk_hashes
        (entry,) = [e for e in trainer.broadcast.service.offered() if e.version == 0]
        assert entry.complete and entry.manifest.publisher == own.publisher

        # the pointer peers read names this trainer's publication
        def pointer_publisher() -> bytes | None:
            assert trainer is not None
            pointer = node.call(trainer.broadcast.records.find_pointer(config.run_id, 0))
            return None if pointer is None else pointer.publisher

        assert wait_until(lambda: pointer_publisher() == own.publisher, 30.0, interval_s=0.5)
    finally:
        if trainer is not None:
            trainer.stop()
        nodes.close()
