"""A whole DiLoCo run simulated on this machine: several trainers, each with its own DHT, on 127.0.0.1.

`simulate_diloco(num_trainers, config, on_progress)` starts a bootstrap DHT and one DHT plus
`TrainerThread` per trainer, runs the whole run and tears everything down (also on exceptions
and KeyboardInterrupt). It returns every outer-step report. Used by `hivenet simulate
--trainers N`, the tests and the DiLoCo benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import torch
from hivemind import DHT

from node.dht_node import start_loopback_dht
from protocol.errors import HivenetError
from training.diloco import OuterStepReport
from training.trainer import TrainerConfig, TrainerRuntime
from training.trainer_thread import TrainerThread

__all__ = ["simulate_diloco"]

logger = logging.getLogger(__name__)

_JOIN_POLL_S = 0.5
_STOP_TIMEOUT_S = 60.0


def simulate_diloco(
    num_trainers: int,
    config: TrainerConfig,
    on_progress: Callable[[OuterStepReport], None] | None = None,
    *,
    stop_event: threading.Event | None = None,
) -> list[OuterStepReport]:
    """Run `num_trainers` DiLoCo trainers (threads, each with its own DHT) on 127.0.0.1; return all reports.

    `config.diloco.max_outer_steps` must be set. Trainer `i` reads shard `i` of `num_trainers`.
    A trainer that fails stops the others; its error is raised once all have ended.
    """
    if num_trainers < 1:
        raise HivenetError(f"need at least one trainer, got {num_trainers}")
    if config.diloco.max_outer_steps is None:
        raise HivenetError("simulate_diloco needs diloco.max_outer_steps so that the run ends")
    torch.set_num_threads(config.torch_threads or 1)
    stop = stop_event or threading.Event()
    reports: list[OuterStepReport] = []
    lock = threading.Lock()
    dhts: list[DHT] = []
    trainers: list[TrainerThread] = []

    def report(r: OuterStepReport) -> None:
        with lock:
            reports.append(r)
        if on_progress is not None:
            on_progress(r)

    try:
        bootstrap = start_loopback_dht()
        dhts.append(bootstrap)
        peers = [str(a) for a in bootstrap.get_visible_maddrs()]
        own = [start_loopback_dht(peers) for _ in range(num_trainers)]
        dhts += own
        # One operator started every trainer: each is an authorised publisher for the others, so a
        # trainer that a round leaves out of sync can take another's state even when no third agrees,
        # and the run names its trainers, so nobody else can join their groups.
        ids = [dht.peer_id.to_base58() for dht in own]
        for i, dht in enumerate(own):
            publishers = [*config.authorized_publishers, *(p for j, p in enumerate(ids) if j != i)]
            cfg = config.model_copy(
                update={
                    "shard_index": i,
                    "num_shards": num_trainers,
                    "authorized_publishers": publishers,
                    "admitted_trainers": [*config.admitted_trainers, *ids],
                }
            )
            runtime = TrainerRuntime(cfg, dht, f"trainer{i}")
            trainers.append(TrainerThread(runtime, stop_event=stop, on_progress=report))
        for trainer in trainers:
            trainer.start()
        while any(t.alive for t in trainers):
            if any(t.error is not None for t in trainers):
                stop.set()
            for trainer in trainers:
                trainer.join(_JOIN_POLL_S)
        errors = [t.error for t in trainers if t.error is not None]
        if errors:
            raise errors[0]
    finally:
        stop.set()
        for trainer in trainers:  # all end their round before any averager goes away
            trainer.join(_STOP_TIMEOUT_S)
        for trainer in trainers:
            trainer.close(timeout_s=0.0)
        for dht in reversed(dhts):
            with contextlib.suppress(Exception):
                dht.shutdown()
    return sorted(reports, key=lambda r: (r.outer_step, r.peer))
