"""An RL run's settings and the window of policy versions a role keeps.

`RLRunConfig` is what every role of a decentralized RL run must agree on: the run, the task,
the model, the GRPO hyper-parameters (group size, async level) and who may publish weights.
`run_task`, `run_tokenizer`, `initial_policy` and `model_from_state` give every role the run's task on
the run's tokenizer and its model, whichever backend the run names (`model` for `tiny`, `hf_model`
for a Hugging Face model). `RoleThread` is the loop thread a role (trainer, inference worker) runs its work on.
`add_policy_follower` hosts the weight broadcast through which inference workers and standalone
validators follow the run's policy. `ModelWindow` holds the newest `async_level + 1` policy versions as models, which is all an
inference worker may generate with; threads wait on it for the first version. (The validator's
`verification.verifier_window.VerifierWindow` holds verifiers instead and judges staleness.) `RLDiLoCoConfig` (the run's
`diloco`) makes several trainers train one policy together (see `training.rl_diloco`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.broadcast.store import VersionEntry
from node.config import check_base58_peer_ids
from node.node import HivenetNode
from protocol.errors import ConfigError
from protocol.limits import MAX_GROUPS_PER_SUBMISSION
from protocol.verification_policy import RunVerification, default_run_verification
from training.causal_lm import CausalLM
from training.grpo import GRPOConfig
from training.model import ModelConfig, TinyGPT
from training.rl_sync import RL_MODEL_CONFIG, pretrained_policy
from training.run_model import HFModelRef, load_run_model, model_skeleton
from training.tasks import DEFAULT_TASK, Task, get_task
from training.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "DTYPES",
    "JUDGE_LINGER_S",
    "JUDGE_MAX_BATCH",
    "ModelWindow",
    "RLDiLoCoConfig",
    "RLRunConfig",
    "RoleThread",
    "add_policy_follower",
    "group_id",
    "held_versions",
    "initial_policy",
    "model_from_state",
    "run_task",
    "run_tokenizer",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""Precisions a worker may generate in, by the name it claims."""

JUDGE_LINGER_S = 0.01
"""How long a validator holds a group that arrived alone, for others to judge it with (a worker's
groups submitted at once arrive within a few milliseconds of each other)."""

JUDGE_MAX_BATCH = 8
"""Most groups a validator judges in one batch."""


class RLDiLoCoConfig(BaseModel):
    """Several trainers of one RL run: H GRPO inner steps each, then one averaged DiLoCo outer step.

    The published policy versions are the outer steps; every trainer of the run must use the
    same settings (and start from the same policy) so that they hold bit-identical states.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    inner_steps: int = Field(default=4, ge=1)
    """H: GRPO steps each trainer makes between two outer steps."""
    outer_lr: float = Field(default=0.7, gt=0.0)
    outer_momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Outer Nesterov SGD (lr 1, momentum 0: plain averaging of the trainers' policies)."""
    compression: Literal["int8", "sparse"] = "int8"
    """Encoding of pseudo-gradients on the wire (every trainer aggregates the same decoded values)."""
    max_group_size: int = Field(default=32, ge=2, le=256)
    """Most trainers of one round."""
    matchmaking_time_s: float = Field(default=2.0, gt=0.0)
    """Minimum time a round's gather stays open for trainers that declared it late."""
    averaging_timeout_s: float = Field(default=300.0, gt=0.0)
    """How long a trainer at an outer-step boundary waits for the others (their inner steps wait for
    rollouts) before it steps alone."""
    sender_timeout_s: float = Field(default=10.0, gt=0.0)
    max_norm_ratio: float = Field(default=10.0, gt=1.0)
    """A contribution whose norm is above this multiple of the round's median norm (or of the floor
    below) is refused, and its sender banned."""
    min_norm_per_value: float | None = Field(default=None, gt=0.0)
    """The cap's floor per value. None: `grpo.lr * inner_steps`, about as far as H AdamW steps move
    a weight, since a trainer whose groups all had equal rewards has a zero pseudo-gradient and
    must not make the round refuse its peers' ordinary ones."""


class RLRunConfig(BaseModel):
    """Everything the trainers, validators and inference workers of one RL run agree on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = "rl"
    task: str = DEFAULT_TASK
    """Name of the task (see `training.tasks.available_tasks`)."""
    model: ModelConfig = RL_MODEL_CONFIG
    """Shape of the run's `tiny` model (used when `hf_model` is None)."""
    hf_model: HFModelRef | None = None
    """The run's Hugging Face model and the hash of its starting weights (None: the `tiny` backend)."""
    grpo: GRPOConfig = GRPOConfig()
    worker_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Precision honest workers generate in (validators recompute in the claimed one)."""
    verification: RunVerification | None = None
    """The limits validators apply, per precision and device class the run allows (`hivenet
    calibrate` writes them; None: the built-in ones of the backend, see `run_verification`)."""
    authorized_publishers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the trainers allowed to publish the run's policy versions."""
    trusted_validators: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the standalone validators whose forwarded rollouts a trainer learns from
    (a trainer always learns from its own validator); a worker submits only to these and to the
    run's trainers (`authorized_publishers`)."""
    admitted_trainers: list[str] = Field(default_factory=list)
    """With `diloco`, base58 PeerIDs of the run's only trainers, when the run names them: a trainer
    averages only with them and takes steps and state only from them (empty: anyone may train)."""
    max_trainer_steps: int | None = Field(default=None, ge=1)
    """The trainer stops after this many GRPO steps (None: until stopped); with `diloco`, a multiple
    of its `inner_steps`, so that no trainer leaves the others waiting in a round it never joins."""
    submit_timeout_s: float = Field(default=120.0, gt=0)
    """How long a worker waits for a validator's verdicts on one group."""
    groups_per_submission: int = Field(default=2, ge=1, le=MAX_GROUPS_PER_SUBMISSION)
    """Groups a worker generates before it submits them, all at once, so that a validator judges
    them in one batch (its cost per group falls); each group is still its own submission."""
    diloco: RLDiLoCoConfig | None = None
    """Several trainers training together (policy version = outer step); None: one trainer whose
    every GRPO step is a policy version."""

    @field_validator("authorized_publishers", "trusted_validators", "admitted_trainers")
    @classmethod
    def _peer_ids(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)

    @property
    def run_verification(self) -> RunVerification:
        """The run's verification limits: `verification`, or the backend's built-in ones."""
        if self.verification is not None:
            return self.verification
        return default_run_verification("tiny" if self.hf_model is None else "hf")

    def check_worker_device(self, device_class: str) -> None:
        """ConfigError unless the run's policy allows its workers' precision on `device_class` (a worker
        whose every rollout would be rejected as `device_not_allowed` is refused before it starts)."""
        verification = self.run_verification
        if verification.for_claim(self.worker_dtype, device_class) is None:
            raise ConfigError(
                f"this run's verification policy does not allow {self.worker_dtype} on {device_class} (it allows "
                f"{verification.allowed()}): start the worker with a --device and --dtype it allows, or ask the "
                "run's operator to calibrate this one (`hivenet calibrate`)"
            )

    @model_validator(mode="after")
    def _verifiable_precision(self) -> RLRunConfig:
        verification = self.run_verification
        if not verification.allows_dtype(self.worker_dtype):
            raise ValueError(
                f"the run's verification policy does not allow {self.worker_dtype} (it allows "
                f"{verification.allowed()}); calibrate it with `hivenet calibrate --dtype {self.worker_dtype}`"
            )
        expected = "tiny" if self.hf_model is None else self.hf_model.weights_sha256
        if verification.model not in (expected, "uncalibrated"):
            raise ValueError(
                f"the verification policy was calibrated on {verification.model[:16]}, not on the run's model "
                f"{expected[:16]}; calibrate this model with `hivenet calibrate`"
            )
        return self

    @model_validator(mode="after")
    def _whole_rounds(self) -> RLRunConfig:
        steps, diloco = self.max_trainer_steps, self.diloco
        if steps is not None and diloco is not None and steps % diloco.inner_steps:
            raise ValueError(
                f"max_trainer_steps ({steps}) must be a multiple of diloco.inner_steps ({diloco.inner_steps})"
            )
        return self


def group_id(worker: bytes, counter: int, validator: bytes) -> bytes:
    """The id of the group of a worker's ticket `counter` from `validator` (each validator numbers its
    own tickets): the rollouts GRPO compares with each other, trained on once."""
    return hashlib.sha256(validator + b"\x00" + worker + counter.to_bytes(8, "big")).digest()


def held_versions(broadcast: WeightBroadcast, run_id: str, newest: int) -> list[VersionEntry]:
    """The `newest` complete versions of `run_id` already in a started broadcast's store, oldest first
    (what a restarted role must load itself: following fetches only versions newer than these)."""
    entries = [broadcast.store.get(run_id, version) for version in broadcast.store.versions(run_id)]
    return [entry for entry in entries if entry is not None and entry.complete][-newest:]


def model_from_state(
    config: RLRunConfig, state: Mapping[str, Any], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> CausalLM:
    """A fresh model of the run's architecture in `dtype` on `device` holding `state`, in eval mode."""
    model: CausalLM = TinyGPT(config.model) if config.hf_model is None else model_skeleton(config.hf_model)
    model.load_state_dict(dict(state))
    return model.to(device=device, dtype=dtype).eval()


def run_tokenizer(config: RLRunConfig) -> Tokenizer:
    """The run's tokenizer: the byte vocabulary, or the one saved with its Hugging Face model."""
    if config.hf_model is None:
        return ByteTokenizer()
    from training.run_model import run_tokenizer as hf_tokenizer

    return hf_tokenizer(config.hf_model)


def run_task(config: RLRunConfig) -> Task:
    """The run's task on the run's tokenizer (ConfigError if this node does not have it)."""
    return get_task(config.task, run_tokenizer(config))


def initial_policy(config: RLRunConfig, device: torch.device | str = "cpu") -> CausalLM:
    """The policy a run starts from, on `device`: the briefly pretrained `tiny` model, or the run's
    Hugging Face model from this node's copy (ModelError if its weights are not the run's)."""
    if config.hf_model is None:
        return pretrained_policy(config.model).to(device)
    return load_run_model(config.hf_model, device=device)


class RoleThread:
    """The loop thread of a role: a subclass starts `_run` with `_start_thread`, which loops until
    `_stop` is set (by `stop`)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.waiting_for: str | None = None
        """What the role waits for now (a sentence for its operator), or None while it works."""

    def _waiting(self, reason: str | None, *, level: int = logging.INFO) -> None:
        """Say what the role waits for, once each time that changes (and when it stops waiting); a
        refusal (a ban, a wrong group size) is a warning, waiting for the run to start is not."""
        if reason == self.waiting_for:
            return
        log = logging.getLogger(type(self).__module__)
        short_id = self.node.short_id  # type: ignore[attr-defined]  # every role has its node
        if reason is not None:
            log.log(level, "[%s] waiting: %s", short_id, reason)
        elif self.waiting_for is not None:
            log.info("[%s] no longer waiting (%s)", short_id, self.waiting_for)
        self.waiting_for = reason

    def _run(self) -> None:
        raise NotImplementedError

    def _start_thread(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ask the loop to stop and wait up to `timeout_s` for it to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def add_policy_follower(node: HivenetNode, config: RLRunConfig) -> WeightBroadcast:
    """Add to `node` the weight broadcast a non-publishing role follows the run's policy with.

    It accepts versions from the run's authorized publishers only and keeps the newest
    `async_level + 1` (all a worker may generate with or a validator verify against).
    """
    return node.add_service(
        WeightBroadcast(
            dht=node.dht,
            identity=node.identity,
            attestations=node.attestations,
            config=BroadcastConfig(
                store_dir=node.config.weights_dir,
                authorized_publishers=list(config.authorized_publishers),
                keep_versions=config.grpo.async_level + 1,
                follow_poll_s=0.5,
            ),
            on_receipts=node.receipt_sink,
            metrics=node.metrics,
        )
    )


class ModelWindow:
    """The newest `size` policy versions, as models to generate with (thread-safe, waitable)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a policy window holds at least one version, got {size}")
        self.size = size
        self._models: dict[int, CausalLM] = {}
        self._changed = threading.Condition()

    def add(self, version: int, model: CausalLM) -> None:
        """Hold `model` as `version`; the oldest versions beyond the window are dropped."""
        with self._changed:
            self._models[version] = model
            for old in sorted(self._models)[: -self.size]:
                del self._models[old]
            self._changed.notify_all()

    def get(self, version: int) -> CausalLM | None:
        with self._changed:
            return self._models.get(version)

    def newest(self) -> tuple[int, CausalLM] | None:
        with self._changed:
            if not self._models:
                return None
            version = max(self._models)
            return version, self._models[version]

    def versions(self) -> list[int]:
        with self._changed:
            return sorted(self._models)

    def wait_for_any(self, timeout_s: float) -> bool:
        """Wait until at least one version is held; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: bool(self._models), timeout_s)
