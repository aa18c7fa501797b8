"""An RL run's settings and the window of policy versions a role keeps.

`RLRunConfig` is what every role of a decentralized RL run must agree on: the run, the task,
the model, the GRPO hyper-parameters (group size, async level) and who may publish weights.
`PolicyWindow` holds the newest `async_level + 1` policy versions as models, which is all a
worker may generate with and all a validator may verify against.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.store import VersionEntry
from training.grpo import GRPOConfig
from training.model import ModelConfig, TinyGPT
from training.rl_sync import RL_MODEL_CONFIG

__all__ = ["DTYPES", "PolicyWindow", "RLRunConfig", "group_id", "held_versions", "model_from_state"]

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


def held_versions(broadcast: WeightBroadcast, run_id: str, newest: int) -> list[VersionEntry]:
    """The `newest` complete versions of `run_id` already in a started broadcast's store, oldest first
    (what a restarted role must load itself: following fetches only versions newer than these)."""
    entries = [broadcast.store.get(run_id, version) for version in broadcast.store.versions(run_id)]
    return [entry for entry in entries if entry is not None and entry.complete][-newest:]


def model_from_state(config: ModelConfig, state: Mapping[str, Any], dtype: torch.dtype) -> TinyGPT:
    """A fresh `TinyGPT` in `dtype` holding `state`, in eval mode."""
    model = TinyGPT(config)
    model.load_state_dict(dict(state))
    return model.to(dtype).eval()


class PolicyWindow:
    """The newest `size` policy versions, as models (thread-safe)."""

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
