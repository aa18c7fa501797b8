"""A trainer on a running node: DiLoCo training plus the weight broadcast that serves its versions.

`start_trainer(node, config, ...)` hosts a `WeightBroadcast` service on the node's runtime
(store: `node.config.weights_dir`), builds the trainer there and trains it in a
`TrainerThread`. After every outer step the trainer publishes the new outer parameters as
version `outer_step` of its run: a signed manifest and hashed chunks that any peer can fetch
(`hivenet weights fetch --publisher <this node's PeerID>`) and re-serve. Trainers holding
bit-identical states publish identical chunks. A failed publish is logged and training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from node.averaging.outer_state import OuterState
from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.node import HivenetNode
from training.diloco import OuterStepReport
from training.trainer import TrainerConfig, TrainerRuntime
from training.trainer_thread import TrainerThread

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 120.0


def start_trainer(
    node: HivenetNode,
    config: TrainerConfig,
    *,
    on_progress: Callable[[OuterStepReport], None] | None = None,
    wait_for_peers: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[TrainerThread, WeightBroadcast]:
    """Start serving weights and training on a started `node` (call from the thread that started it:
    the averager forks a process and installs signal handlers)."""
    assert node.dht is not None, "start the node first"
    broadcast = node.add_service(
        WeightBroadcast(
            dht=node.dht,
            identity=node.identity,
            config=BroadcastConfig(
                store_dir=node.config.weights_dir,
                authorized_publishers=[node.identity.peer_id.to_base58()],
            ),
        )
    )
    runtime: TrainerRuntime | None = None

    def publish(state: OuterState) -> None:
        assert runtime is not None
        try:
            manifest = node.call(
                broadcast.publish(config.run_id, state.step, runtime.state_dict(state)),
                timeout_s=PUBLISH_TIMEOUT_S,
            )
        except Exception as exc:
            logger.warning("could not publish version %d of run %s: %r", state.step, config.run_id, exc)
            return
        logger.info("published version %d (%d bytes)", state.step, manifest.total_bytes)

    runtime = TrainerRuntime(config, node.dht, node.short_id, on_outer_state=publish)
    thread = TrainerThread(
        runtime, on_progress=on_progress, wait_for_peers=wait_for_peers, should_stop=should_stop
    ).start()
    return thread, broadcast
