"""A loopback harness of DiLoCo trainer threads and tiny configs, for tests and benchmarks.

`tiny_config` gives a CPU-sized `TrainerConfig`; `averager_swarm` yields bare averagers on
loopback that already see each other; `harness()` yields a `Harness` with a
bootstrap DHT on 127.0.0.1 where `start`/`start_many` launch trainers (each with its own
DHT and averager) and `TrainerHandle.kill` makes one die without a goodbye. Closing the
harness ends exactly the threads and processes it started.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from hivemind import DHT

from node.averaging.averager import DiLoCoAverager
from node.swarm import wait_until
from node.trainer import OuterStepReport, TrainerConfig, TrainerRuntime
from protocol.errors import HivenetError
from training.data import DataConfig
from training.diloco import DiLoCoConfig
from training.model import ModelConfig


def tiny_config(max_outer_steps: int, *, inner_steps: int = 8, **overrides: Any) -> TrainerConfig:
    """A trainer config small enough for CPU tests: a ~20k-parameter model on stdlib text."""
    base: dict[str, Any] = dict(
        run_id="test-run",
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64),
        data=DataConfig(source="stdlib", max_corpus_bytes=300_000, block_bytes=256, seq_len=32, batch_size=4),
        diloco=DiLoCoConfig(inner_steps=inner_steps, max_outer_steps=max_outer_steps, inner_warmup_steps=0),
        compression="int8",
        eval_batches=1,
        matchmaking_time_s=2.0,
        request_timeout_s=0.5,
        averaging_timeout_s=20.0,
        sender_timeout_s=5.0,
        join_wait_s=60.0,
        torch_threads=1,
    )
    base.update(overrides)
    return TrainerConfig(**base)


def loopback_dht(initial_peers: list[str] | None = None) -> DHT:
    return DHT(start=True, initial_peers=initial_peers or [], host_maddrs=["/ip4/127.0.0.1/tcp/0"])


@contextlib.contextmanager
def averager_swarm(
    shapes: Sequence[torch.Size], classes: Sequence[type[DiLoCoAverager]], **kwargs: Any
) -> Iterator[list[DiLoCoAverager]]:
    """One averager of each class (named peer0, peer1, ...), each with its own DHT, on 127.0.0.1.

    Yields once every averager sees all the others through the DHT: a round begun while the
    swarm is still forming can fail to find a group on a loaded machine.
    """
    dhts: list[DHT] = []
    averagers: list[DiLoCoAverager] = []
    try:
        dhts.append(loopback_dht())
        peers = [str(a) for a in dhts[0].get_visible_maddrs()]
        for i, cls in enumerate(classes):
            dhts.append(loopback_dht(peers))
            averagers.append(cls(shapes, dhts[-1], name=f"peer{i}", **kwargs))
        for a in averagers:
            a.publish_step(0)
        others = len(averagers) - 1
        if not wait_until(lambda: all(len(a.peer_steps()) == others for a in averagers), timeout_s=60):
            raise HivenetError("the averagers did not find each other through the DHT within 60 s")
        yield averagers
    finally:
        for a in averagers:
            a.shutdown()
        for d in reversed(dhts):
            d.shutdown()


@dataclass
class TrainerHandle:
    runtime: TrainerRuntime
    dht: DHT
    stop: threading.Event
    thread: threading.Thread
    reports: list[OuterStepReport] = field(default_factory=list)
    error: BaseException | None = None

    def steps(self) -> int:
        return self.reports[-1].outer_step if self.reports else 0

    def kill(self) -> None:
        """Die without a goodbye: SIGKILL this trainer's averager, DHT and p2pd processes."""
        self.stop.set()
        procs = []
        for pid in (self.runtime.averager.pid, self.dht.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                procs.extend([proc, *proc.children(recursive=True)])
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


class Harness:
    """A bootstrap DHT and trainer threads on 127.0.0.1; `close` ends exactly what it started."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.bootstrap = loopback_dht()
        self.peers = [str(a) for a in self.bootstrap.get_visible_maddrs()]
        self.trainers: list[TrainerHandle] = []

    def start(self, config: TrainerConfig, name: str) -> TrainerHandle:
        """Start one trainer now."""
        handle = self.prepare(config, name)
        handle.thread.start()
        return handle

    def start_many(self, config: TrainerConfig, names: list[str]) -> list[TrainerHandle]:
        """Build all trainers first, then start them together (as peers that start at the same time)."""
        handles = [self.prepare(config, name) for name in names]
        for handle in handles:
            handle.thread.start()
        return handles

    def prepare(self, config: TrainerConfig, name: str) -> TrainerHandle:
        """Build a trainer (DHT, model, averager) without starting its thread."""
        dht = loopback_dht(self.peers)
        runtime = TrainerRuntime(config, dht, name)
        stop = threading.Event()
        handle = TrainerHandle(runtime, dht, stop, threading.Thread(target=lambda: None))

        def work() -> None:
            try:
                runtime.train(stop, handle.reports.append)
            except BaseException as e:
                handle.error = e

        handle.thread = threading.Thread(target=work, name=name, daemon=True)
        self.trainers.append(handle)
        return handle

    def close(self) -> None:
        for t in self.trainers:
            t.stop.set()
        for t in self.trainers:
            if t.thread.ident is not None:
                t.thread.join(timeout=60)
            with contextlib.suppress(Exception):
                t.runtime.close()
            with contextlib.suppress(Exception):
                t.dht.shutdown()
        self.bootstrap.shutdown()


@contextlib.contextmanager
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()


def hashes_by_step(reports: list[OuterStepReport]) -> dict[int, str]:
    return {r.outer_step: r.outer_hash for r in reports}


def checkpoint_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / name / "checkpoints"
