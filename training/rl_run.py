"""An RL run's settings and the window of policy versions a role keeps.

`RLRunConfig` is what every role of a decentralized RL run must agree on: the run, the task,
the model, the GRPO hyper-parameters (group size, async level) and who may publish weights.
`RoleThread` is the loop thread a role (trainer, inference worker) runs its work on.
`add_policy_follower` hosts the weight broadcast through which inference workers and standalone
validators follow the run's policy. `ModelWindow` holds the newest `async_level + 1` policy versions as models, which is all an
inference worker may generate with; threads wait on it for the first version. (The validator's
`verification.verifier_window.VerifierWindow` holds verifiers instead and judges staleness.)
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.node import HivenetNode
from training.grpo import GRPOConfig
from training.model import ModelConfig, TinyGPT
from training.rl_sync import RL_MODEL_CONFIG

__all__ = [
    "DTYPES",
    "ModelWindow",
    "RLRunConfig",
    "RoleThread",
    "add_policy_follower",
    "group_id",
    "model_from_state",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""Precisions a worker may generate in, by the name it claims."""


class RLRunConfig(BaseModel):
    """Everything the trainers, validators and inference workers of one RL run agree on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = "rl"
    task: str = "line-length"
    """Name of the task (see `training.tasks.TASKS`)."""
    model: ModelConfig = RL_MODEL_CONFIG
    grpo: GRPOConfig = GRPOConfig()
    worker_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Precision honest workers generate in (validators recompute in the claimed one)."""
    authorized_publishers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the trainers allowed to publish the run's policy versions."""
    trusted_validators: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the standalone validators whose forwarded rollouts a trainer learns from
    (a trainer always learns from its own validator)."""
    max_trainer_steps: int | None = Field(default=None, ge=1)
    """The trainer stops after this many GRPO steps (None: until stopped)."""
    submit_timeout_s: float = Field(default=120.0, gt=0)
    """How long a worker waits for a validator's verdicts on one group."""


def group_id(worker: bytes, counter: int) -> bytes:
    """The id of a worker's `counter`-th group: the rollouts GRPO compares with each other."""
    return hashlib.sha256(worker + counter.to_bytes(8, "big")).digest()


def model_from_state(config: ModelConfig, state: Mapping[str, Any], dtype: torch.dtype) -> TinyGPT:
    """A fresh `TinyGPT` in `dtype` holding `state`, in eval mode."""
    model = TinyGPT(config)
    model.load_state_dict(dict(state))
    return model.to(dtype).eval()


class RoleThread:
    """The loop thread of a role: a subclass starts `_run` with `_start_thread`, which loops until
    `_stop` is set (by `stop`)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            config=BroadcastConfig(
                store_dir=node.config.weights_dir,
                authorized_publishers=list(config.authorized_publishers),
                keep_versions=config.grpo.async_level + 1,
                follow_poll_s=0.5,
            ),
        )
    )


class ModelWindow:
    """The newest `size` policy versions, as models to generate with (thread-safe, waitable)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a policy window holds at least one version, got {size}")
        self.size = size
        self._models: dict[int, TinyGPT] = {}
        self._changed = threading.Condition()

    def add(self, version: int, model: TinyGPT) -> None:
        """Hold `model` as `version`; the oldest versions beyond the window are dropped."""
        with self._changed:
            self._models[version] = model
            for old in sorted(self._models)[: -self.size]:
                del self._models[old]
            self._changed.notify_all()

    def get(self, version: int) -> TinyGPT | None:
        with self._changed:
            return self._models.get(version)

    def newest(self) -> tuple[int, TinyGPT] | None:
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
