"""A trainer on a running node: DiLoCo training plus the weight broadcast that serves its versions.

`start_trainer(node, config, ...)` hosts a `WeightBroadcast` service on the node's runtime
(store: `node.config.weights_dir`), builds the trainer there and trains it in a
`TrainerThread`. After every outer step the trainer publishes the new outer parameters as
version `outer_step` of its run: a signed manifest and hashed chunks that any peer can fetch
(`hivenet weights fetch --publisher <this node's PeerID>`) and re-serve. Trainers holding
bit-identical states publish identical chunks. A failed publish is logged and training goes on.
Every progress report also moves the node's metrics (`node.metrics`: outer steps, loss, tokens
trained, averaging bytes sent) before it is handed to `on_progress`; the broadcast counts into
the same metrics. On a node with a ledger, the trainer signs a training receipt after every round
for each other member whose contribution it accepted (`sign_training_receipts`), and the broadcast
its transfer receipts; both go to the node's `receipt_sink`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.collective.outer_state import OuterState
from node.metrics import NodeMetrics
from node.node import HivenetNode
from protocol.receipts import MAX_ROUND_ID_BYTES, seal_training_receipt
from training.diloco import OuterStepReport
from training.trainer import TrainerConfig, TrainerRuntime
from training.trainer_thread import TrainerThread

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 120.0


def counting_progress(
    metrics: NodeMetrics, on_progress: Callable[[OuterStepReport], None] | None = None
) -> Callable[[OuterStepReport], None]:
    """A progress callback that counts each report into `metrics`, then calls `on_progress`.

    A report carries running totals (tokens, bytes sent); the metrics get what each step added.
    """
    previous = {"tokens": 0, "bytes_sent": 0}

    def report_progress(report: OuterStepReport) -> None:
        metrics.outer_step_done(
            train_loss=report.train_loss,
            tokens_trained=max(0, report.tokens - previous["tokens"]),
            averaging_bytes_sent=max(0, report.bytes_sent - previous["bytes_sent"]),
        )
        previous["tokens"] = max(previous["tokens"], report.tokens)
        previous["bytes_sent"] = max(previous["bytes_sent"], report.bytes_sent)
        if on_progress is not None:
            on_progress(report)

    return report_progress


def sign_training_receipts(
    report: OuterStepReport, private_key: Ed25519PrivateKey, *, run_id: str, tokens_trained: int
) -> list[bytes]:
    """One training receipt per other member of the report's round whose contribution was accepted.

    `tokens_trained` is what one member trains per outer step, from the run's config (never a
    figure a member claimed); the bytes are those this trainer received from the member. Each
    receipt also carries this trainer's own mean inner loss of the step (`signer_loss`; 0, "not
    reported", if it was not a finite number: the receipt stays valid).
    """
    if not 1 <= len(report.round_id) <= MAX_ROUND_ID_BYTES:  # alone, or a group id no receipt can hold
        return []
    loss = report.train_loss if math.isfinite(report.train_loss) and report.train_loss >= 0 else 0.0
    return [
        seal_training_receipt(
            private_key,
            run_id=run_id,
            contributor=member,
            outer_step=report.averaged_step,
            round_id=report.round_id,
            tokens_trained=tokens_trained,
            bytes_exchanged=received,
            signer_loss=loss,
        )
        for member, received in sorted(report.received_from.items())
    ]


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
            attestations=node.attestations,
            config=BroadcastConfig(
                store_dir=node.config.weights_dir,
                authorized_publishers=list(
                    dict.fromkeys([node.identity.peer_id.to_base58(), *config.authorized_publishers])
                ),
            ),
            metrics=node.metrics,
            on_receipts=node.receipt_sink,
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
        logger.debug("published version %d (%d bytes)", state.step, manifest.total_bytes)

    sink = node.receipt_sink
    tokens_per_outer_step = config.diloco.inner_steps * config.data.batch_size * config.data.seq_len

    def receipted(report: OuterStepReport) -> None:
        if sink is not None:
            sink(sign_training_receipts(
                report, node.identity.private_key, run_id=config.run_id, tokens_trained=tokens_per_outer_step
            ))  # fmt: skip
        if on_progress is not None:
            on_progress(report)

    runtime = TrainerRuntime(config, node.dht, node.short_id, on_outer_state=publish)
    thread = TrainerThread(
        runtime,
        on_progress=counting_progress(node.metrics, receipted),
        wait_for_peers=wait_for_peers,
        should_stop=should_stop,
    ).start()
    return thread, broadcast
