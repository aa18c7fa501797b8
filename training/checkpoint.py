"""DiLoCo checkpoints: the outer state (parameters, momentum, step) in one safetensors file.

Files are written atomically (temporary file, fsync, rename), so a trainer killed while
writing leaves the previous checkpoint intact. `latest_checkpoint` finds the newest one in a
directory; `prune_checkpoints` keeps the last few.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from node.collective.outer_state import OuterState
from protocol.errors import HivenetError

__all__ = ["CheckpointError", "latest_checkpoint", "load_checkpoint", "prune_checkpoints", "save_checkpoint"]

_NAME_RE = re.compile(r"^outer-(\d{8})\.safetensors$")


class CheckpointError(HivenetError):
    """A checkpoint file is unreadable or does not fit the model."""


def checkpoint_path(directory: Path, step: int) -> Path:
    """Where the checkpoint of outer step `step` lives in `directory`."""
    return directory / f"outer-{step:08d}.safetensors"


def save_checkpoint(directory: Path, state: OuterState, *, run_id: str) -> Path:
    """Write `state` to `directory/outer-<step>.safetensors` atomically and return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"param.{i:04d}": p.contiguous() for i, p in enumerate(state.params)}
    tensors.update({f"momentum.{i:04d}": m.contiguous() for i, m in enumerate(state.momentum)})
    metadata = {"step": str(state.step), "run_id": run_id, "hash": state.hash(), "format": "hivenet-diloco-1"}
    path = checkpoint_path(directory, state.step)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: Path, *, run_id: str | None = None) -> OuterState:
    """Read a checkpoint; raise CheckpointError if it is corrupt, from another run, or fails its hash."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {e}; delete it to start from peers or scratch"
        ) from None
    if metadata.get("format") != "hivenet-diloco-1":
        raise CheckpointError(f"{path} is not a hivenet DiLoCo checkpoint")
    if run_id is not None and metadata.get("run_id") != run_id:
        raise CheckpointError(f"{path} belongs to run {metadata.get('run_id')!r}, not {run_id!r}")
    n = sum(1 for k in tensors if k.startswith("param."))
    try:
        params = [tensors[f"param.{i:04d}"].to(torch.float32) for i in range(n)]
        momentum = [tensors[f"momentum.{i:04d}"].to(torch.float32) for i in range(n)]
        state = OuterState(params, momentum, int(metadata["step"]))
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path} is incomplete ({e})") from None
    if state.hash() != metadata.get("hash"):
        raise CheckpointError(f"{path} fails its hash check; it is corrupt")
    return state


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint with the highest step in `directory`, or None."""
    if not directory.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME_RE.match(p.name))]
    return max(found)[1] if found else None


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Delete all but the `keep` newest checkpoints in `directory`."""
    found = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME_RE.match(p.name)))
    for _, path in found[: max(0, len(found) - keep)]:
        path.unlink(missing_ok=True)
