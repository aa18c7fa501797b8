"""The DiLoCo trainer role: its settings, its runtime objects, and training until told to stop.

* `TrainerConfig`: everything a trainer needs besides the node's DHT (run, model, data, DiLoCo,
  wire codec, checkpoints, round timeouts, bans).
* `TrainerRuntime(config, dht, name)` loads the corpus shard, builds the model and starts the
  averager; `train(stop_event, on_progress)` resumes from the newest checkpoint, joins the run
  (downloading the outer state from peers if the run is ahead, at the next outer-step
  boundary), then trains until `stop_event` is set or `max_outer_steps` is reached, writing
  checkpoints as it goes. At `max_outer_steps` it declares its run ended and serves its final
  state until the run's other trainers have reached that step (`GatherAverager.hold_final_state`):
  a trainer that the last round left out of sync takes it then. `close` releases the averager.
* `run_trainer(config, dht=..., identity=..., stop_event=..., on_progress=...)` does all of it
  in the calling thread. `training.trainer_thread.TrainerThread` runs a runtime in a thread.

The network side of a round lives in `node.collective.averager.GatherAverager`; the training
loop is `training.diloco.DiLoCoTrainer`, which sees the network only through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from hivemind import DHT
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from node.collective.outer_state import OuterState
from node.collective.rules import DEFAULT_RULE, AggregationRule
from node.config import check_base58_peer_ids
from node.identity import Identity
from protocol.dht_keys import validate_run_id
from protocol.errors import HivenetError
from training.averagers import make_averager
from training.causal_lm import CausalLM
from training.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from training.data import Corpus, DataConfig, load_corpus
from training.devices import resolve_device
from training.diloco import DiLoCoConfig, DiLoCoTrainer, OuterStepReport
from training.model import ModelConfig, TinyGPT
from training.run_model import HFModelRef, load_run_model, run_tokenizer
from training.state_check import plausible_state

__all__ = ["TrainerConfig", "TrainerRuntime", "run_trainer", "trainer_corpus", "trainer_model"]

logger = logging.getLogger(__name__)


class TrainerConfig(BaseModel):
    """Everything a DiLoCo trainer needs besides the runtime objects (DHT, identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = "default"
    """The run to train; trainers of the same run average with each other."""

    model: ModelConfig = ModelConfig()
    """Shape of the `tiny` model (the same on every trainer of the run; used when `hf_model` is None)."""

    hf_model: HFModelRef | None = None
    """The run's Hugging Face model and the hash of its starting weights (None: the `tiny` backend);
    its tokenizer cuts the corpus into tokens."""

    data: DataConfig = DataConfig()
    """Corpus, sequence length and batch size."""

    diloco: DiLoCoConfig = DiLoCoConfig()
    """Inner/outer optimizer settings (H, learning rates, momentum, max outer steps)."""

    seed: int = 0
    """Seed of the model's initial weights (the same on every trainer, so step 0 agrees)."""

    compression: Literal["int8", "sparse"] = "int8"
    """Encoding of pseudo-gradients on the wire: "int8" (dense, blockwise int8) or "sparse"
    (SparseLoCo: per-chunk top-k, 2-bit values, error feedback)."""

    sparse_density: float = Field(default=0.015, gt=0.0, le=0.5)
    """Fraction of each chunk's values the sparse codec sends."""

    sparse_chunk_values: int = Field(default=4096, ge=64, le=65536)
    """Chunk size of the sparse codec (a power of two)."""

    shard_index: int | None = Field(default=None, ge=0)
    """This trainer's data shard; None derives it from the PeerID."""

    num_shards: int = Field(default=16, ge=1)
    """Number of disjoint data shards the corpus is dealt into."""

    eval_batches: int = Field(default=4, ge=0)
    """Held-out batches used for the eval loss."""

    checkpoint_dir: Path | None = None
    """Where checkpoints are written and resumed from (None: no checkpoints)."""

    checkpoint_every_outer_steps: int = Field(default=10, ge=1)
    """Write a checkpoint every this many outer steps (and when stopping)."""

    checkpoints_to_keep: int = Field(default=3, ge=1)
    """Older checkpoints are deleted."""

    matchmaking_time_s: float = Field(default=2.0, gt=0.0)
    """Minimum time a round's gather stays open, so that trainers that declared the round late are found."""

    averaging_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long a round may take after it was due before the trainer steps alone."""

    sender_timeout_s: float = Field(default=10.0, gt=0.0)
    """Longest one exchange with one member may take, and how long past the gather a round waits
    for its members' commits."""

    max_group_size: int = Field(default=32, ge=2, le=256)
    """Most members of one round (this trainer included); trainers beyond are not contacted."""

    max_norm_ratio: float = Field(default=10.0, gt=1.0)
    """A contribution whose norm is above this multiple of the round's median norm is refused."""

    aggregation: AggregationRule = DEFAULT_RULE
    """How every member combines the round's contributions: "centered_clip" (robust to a minority
    of attackers inside the norm cap) or "mean" (the plain mean, for comparison)."""

    ban_base_s: float = Field(default=60.0, gt=0.0)
    """First ban of a peer that broke the averaging protocol (e.g. a contribution that does not
    decode); doubles with every offence."""

    join_wait_s: float = Field(default=120.0, ge=0.0)
    """A late joiner waits at most this long for the next outer step boundary before downloading."""

    state_download_timeout_s: float = Field(default=60.0, gt=0.0)
    """Timeout of one state download."""

    device: str = "cpu"
    """Where the model trains (cpu, cuda, cuda:N, mps; checked at start); the outer state stays on the CPU."""

    torch_threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads (None: leave torch's default)."""

    authorized_publishers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the run's authorised publishers (typically its other trainers): their
    published versions are accepted, and a resync takes their verified outer state on their word
    alone, while anyone else's needs a second source that agrees. A run of two trainers needs
    them named to recover from a diverged round."""

    admitted_trainers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the run's trainers, when the run names them: this trainer then averages
    only with them and takes steps and state only from them, so identities minted by anyone
    cannot crowd its matchmaking or outvote the run's step. Empty: an open run, anyone trains."""

    @model_validator(mode="after")
    def _chunk_is_a_power_of_two(self) -> TrainerConfig:
        if self.sparse_chunk_values & (self.sparse_chunk_values - 1):
            raise ValueError(f"sparse_chunk_values must be a power of two, not {self.sparse_chunk_values}")
        return self

    @field_validator("authorized_publishers", "admitted_trainers")
    @classmethod
    def _peer_ids(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)


def trainer_model(config: TrainerConfig) -> CausalLM:
    """The run's starting model on the trainer's device: a seeded `tiny` model, or this node's copy of
    the run's Hugging Face model (ModelError if its weights are not the run's or the device is missing)."""
    device = resolve_device(config.device)
    if config.hf_model is None:
        return TinyGPT(config.model).to(device)
    return load_run_model(config.hf_model, device=device).train()


def trainer_corpus(config: TrainerConfig) -> Corpus:
    """The run's corpus, cut into the run's tokens (bytes for `tiny`, the model's tokenizer for `hf`)."""
    if config.hf_model is None:
        return load_corpus(config.data)
    return load_corpus(config.data, run_tokenizer(config.hf_model).encode)


def _shard_for(config: TrainerConfig, peer_id: bytes) -> int:
    if config.shard_index is not None:
        if config.shard_index >= config.num_shards:
            raise HivenetError(
                f"shard_index {config.shard_index} must be below num_shards {config.num_shards}"
            )
        return config.shard_index
    return int.from_bytes(hashlib.sha256(peer_id).digest()[:8], "little") % config.num_shards


class TrainerRuntime:
    """One trainer's runtime objects: model, data shard and started averager; `train` runs it, `close` ends it.

    Built in the calling thread (the averager forks a process and installs signal handlers),
    then trained in any thread. `dht` stays the caller's: `close` does not shut it down.
    """

    def __init__(
        self,
        config: TrainerConfig,
        dht: DHT,
        name: str,
        *,
        on_outer_state: Callable[[OuterState], None] | None = None,
    ) -> None:
        """`on_outer_state(state)` is called in the training thread after every outer step (and its
        checkpoint), e.g. to publish the new weights."""
        validate_run_id(config.run_id)
        self.on_outer_state = on_outer_state
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        self.dht = dht
        self.name = name
        torch.manual_seed(config.seed)
        self.model = trainer_model(config)
        corpus = trainer_corpus(config)
        peer_bytes = dht.peer_id.to_bytes()
        shard = _shard_for(config, peer_bytes)
        # Peers that share a shard (PeerID-derived shards can collide) still draw different batches.
        offset = (
            0
            if config.shard_index is not None
            else int.from_bytes(hashlib.sha256(b"s" + peer_bytes).digest()[:4])
        )
        self.sampler = corpus.sampler(shard, config.num_shards, seed_offset=offset)
        self.eval_batches = corpus.eval_batches(config.eval_batches) if config.eval_batches else []
        self.averager = make_averager(config, dht, name, [p.shape for p in self.model.parameters()])
        logger.info(
            "%s: trainer ready (run %s, shard %d of %d)", name, config.run_id, shard, config.num_shards
        )

    def state_dict(self, state: OuterState) -> dict[str, torch.Tensor]:
        """The outer parameters of `state` under the model's parameter names (what gets published)."""
        names = [name for name, _ in self.model.named_parameters()]
        return dict(zip(names, state.params, strict=True))

    def _resume_state(self) -> OuterState:
        state = OuterState.from_model(self.model)
        directory = self.config.checkpoint_dir
        path = latest_checkpoint(directory) if directory is not None else None
        if path is not None:
            try:
                loaded = load_checkpoint(path, run_id=self.config.run_id)
            except CheckpointError as e:
                logger.warning("%s: ignoring checkpoint: %s", self.name, e)
            else:
                if loaded.matches(self.model):
                    logger.info("%s: resumed from %s (outer step %d)", self.name, path, loaded.step)
                    return loaded
                logger.warning("%s: checkpoint %s does not fit the model; ignoring it", self.name, path)
        return state

    def _join(self, state: OuterState, stop_event: threading.Event) -> OuterState:
        """If the run is ahead of `state`, wait for its next outer-step boundary and download the state."""
        steps = self.averager.peer_steps()
        if not steps:
            return state
        median = statistics.median_low(steps.values())
        if median <= state.step:
            return state
        logger.info("%s: run is at outer step ~%d; waiting for the next step to join", self.name, median)
        deadline = time.monotonic() + self.config.join_wait_s
        while not stop_event.is_set() and time.monotonic() < deadline:
            current = self.averager.peer_steps()
            if current and statistics.median_low(current.values()) > median:
                break
            stop_event.wait(0.1)
        fetched = self.averager.fetch_state(
            newer_than=state.step, timeout_s=self.config.state_download_timeout_s, stop_event=stop_event
        )
        if fetched is None or not fetched.matches(self.model):
            logger.warning("%s: could not download the run's state; starting from our own", self.name)
            return state
        if not plausible_state(self.model, state, fetched, self.eval_batches, name=self.name):
            return state
        logger.info("%s: joined at outer step %d (state %s)", self.name, fetched.step, fetched.hash())
        return fetched

    def _checkpoint(self, trainer: DiLoCoTrainer, force: bool = False) -> None:
        directory = self.config.checkpoint_dir
        if directory is None:
            return
        state = trainer.current_state()
        if force or state.step % self.config.checkpoint_every_outer_steps == 0:
            path = save_checkpoint(directory, state, run_id=self.config.run_id)
            prune_checkpoints(directory, self.config.checkpoints_to_keep)
            logger.info("%s: wrote %s", self.name, path)

    def train(
        self, stop_event: threading.Event, on_progress: Callable[[OuterStepReport], None] | None
    ) -> None:
        state = self._join(self._resume_state(), stop_event)
        trainer = DiLoCoTrainer(
            self.model,
            self.config.diloco,
            next_batch=self.sampler.next_batch,
            averager=self.averager,
            state_source=self.averager,
            initial_state=state,
            eval_batches=self.eval_batches,
            name=self.name,
            on_state_applied=lambda applied: self.averager.publish_step(applied.step),
        )
        self.averager.set_state_provider(trainer.current_state)
        self.averager.publish_step(state.step)

        def after_outer_step(t: DiLoCoTrainer) -> None:
            self._checkpoint(t)
            if self.on_outer_state is not None:
                self.on_outer_state(t.state)

        try:
            trainer.run(stop_event, on_progress, on_outer_step=after_outer_step)
            if not stop_event.is_set():  # the run's last outer step: see the others to it
                final = trainer.current_state()
                if not self.averager.hold_final_state(final.step, final.hash(), stop_event=stop_event):
                    logger.info(
                        "%s: not every trainer of the run reached outer step %d", self.name, final.step
                    )
        finally:
            self.averager.cancel_round()
            with contextlib.suppress(OSError):
                self._checkpoint(trainer, force=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.averager.cancel_round()
        if self.averager.is_alive():
            self.averager.shutdown()


def run_trainer(
    config: TrainerConfig,
    *,
    dht: DHT,
    identity: Identity | None = None,
    stop_event: threading.Event,
    on_progress: Callable[[OuterStepReport], None] | None = None,
) -> None:
    """Train as one DiLoCo trainer of `config.run_id` until `stop_event` is set (or max_outer_steps).

    `dht` is the node's running DHT (the averager shares its p2pd); `identity` only names the
    trainer in logs and reports (its short PeerID). Blocks; returns cleanly once `stop_event` is
    set, after finishing the round in flight and writing a final checkpoint.
    """
    name = identity.short_id if identity is not None else dht.peer_id.to_base58()[-8:]
    prepared = TrainerRuntime(config, dht, name)
    try:
        prepared.train(stop_event, on_progress)
    finally:
        prepared.close()
