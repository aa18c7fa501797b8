"""A loopback harness of DiLoCo trainer threads and tiny configs, for tests and benchmarks.

`tiny_config` gives a CPU-sized `TrainerConfig`; `harness()` yields a `Harness` with a bootstrap DHT on
127.0.0.1 where `start`/`start_many` launch trainers (each a `TrainerThread` with its own DHT
and averager) and `TrainerThread.kill` makes one die without a goodbye. Closing the harness
ends exactly the threads and processes it started.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from hivemind import DHT

from node.dht_node import start_loopback_dht
from node.swarm import wait_until
from training.data import DataConfig
from training.diloco import DiLoCoConfig, OuterStepReport
from training.model import ModelConfig
from training.trainer import TrainerConfig, TrainerRuntime
from training.trainer_thread import TrainerThread


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
        averaging_timeout_s=20.0,
        sender_timeout_s=5.0,
        join_wait_s=60.0,
        torch_threads=1,
    )
    base.update(overrides)
    return TrainerConfig(**base)


AVERAGING_MODES = ("int8", "sparse")
"""The codecs a test's trainers may average with (`averaging_mode` gives the config fields)."""


def averaging_mode(mode: str) -> dict[str, Any]:
    """TrainerConfig fields for one of `AVERAGING_MODES` (the sparse codec keeps 5% of 256-value
    chunks: the tiny model has too few values for the production density to send many)."""
    fields: dict[str, Any] = {"compression": mode}
    if mode == "sparse":
        fields.update(sparse_density=0.05, sparse_chunk_values=256)
    return fields


def finished(trainer: TrainerThread, steps: int) -> Callable[[], bool]:
    """Whether `trainer` made `steps` outer steps or stopped (a predicate for `wait_until`)."""
    return lambda: trainer.steps() >= steps or not trainer.alive


class Harness:
    """A bootstrap DHT and trainer threads on 127.0.0.1; `close` ends exactly what it started."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.bootstrap = start_loopback_dht()
        self.peers = [str(a) for a in self.bootstrap.get_visible_maddrs()]
        self.trainers: list[TrainerThread] = []

    def start(self, config: TrainerConfig, name: str) -> TrainerThread:
        """Start one trainer now."""
        return self.prepare(config, name).start()

    def start_many(self, config: TrainerConfig, names: list[str]) -> list[TrainerThread]:
        """Build all trainers first, then start them together (as peers that start at the same time)."""
        trainers = [self.prepare(config, name) for name in names]
        for trainer in trainers:
            trainer.start()
        return trainers

    def prepare(
        self, config: TrainerConfig, name: str, dht: DHT | None = None, *, wait_for_peers: int = 0
    ) -> TrainerThread:
        """Build a trainer (DHT, model, averager) without starting its thread; with `wait_for_peers`,
        its first inner step waits until that many other trainers are up (`--wait-for-trainers`)."""
        dht = dht or start_loopback_dht(self.peers)
        trainer = TrainerThread(TrainerRuntime(config, dht, name), wait_for_peers=wait_for_peers)
        self.trainers.append(trainer)
        return trainer

    def prepare_publishers(self, config: TrainerConfig, names: list[str]) -> list[TrainerThread]:
        """Build trainers that name each other as the run's authorised publishers (`prepare` each)."""
        dhts = [start_loopback_dht(self.peers) for _ in names]
        ids = [dht.peer_id.to_base58() for dht in dhts]
        return [
            self.prepare(
                config.model_copy(update={"authorized_publishers": [p for p in ids if p != own]}), name, dht
            )
            for name, dht, own in zip(names, dhts, ids, strict=True)
        ]

    def close(self) -> None:
        for t in self.trainers:
            t.request_stop()
        for t in self.trainers:
            t.close(timeout_s=60)
            with contextlib.suppress(Exception):
                t.runtime.dht.shutdown()
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


def assert_a_late_joiner_catches_up(config: TrainerConfig, *, join_after: int) -> list[TrainerThread]:
    """Two trainers train `config`'s run; once both made `join_after` outer steps a third joins. All three
    finish the run without error, in one state after every round, the joiner from the run's step (not
    from 0) with the run's parameters and momentum (the state hash covers both). Returns the three."""
    steps = config.diloco.max_outer_steps
    assert steps is not None and steps > join_after
    with harness() as h:
        a, b = h.start_many(config, ["early0", "early1"])
        # Built (DHT, model, corpus) while the run starts, so that joining costs it only the join.
        late = h.prepare(config, "late")
        assert wait_until(lambda: a.steps() >= join_after and b.steps() >= join_after, timeout_s=180)
        joined_at = max(a.steps(), b.steps())
        late.start()
        for trainer in (a, b, late):
            assert wait_until(finished(trainer, steps), timeout_s=240)
        assert [t.error for t in (a, b, late)] == [None, None, None]
        assert [t.steps() for t in (a, b, late)] == [steps] * 3
        early = hashes_by_step(a.reports)
        assert sorted(early) == list(range(1, steps + 1)) and hashes_by_step(b.reports) == early
        assert late.reports[0].outer_step > joined_at
        shared = [r for r in late.reports if r.num_peers == 3]
        assert shared, "the joiner never averaged with the others"
        for r in shared:
            assert r.outer_hash == early[r.outer_step], f"joiner differs after outer step {r.outer_step}"
        assert late.reports[-1].outer_hash == early[steps]
        return [a, b, late]
