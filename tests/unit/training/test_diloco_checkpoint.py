"""Checkpoints: round trip, newest-first discovery, pruning, and refusal of corrupt or foreign files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.collective.outer_state import OuterState
from training.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)


def _state(step: int) -> OuterState:
    gen = torch.Generator().manual_seed(step)
    params = [torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)]
    return OuterState(params, [torch.randn(p.shape, generator=gen) for p in params], step)


def test_round_trip_latest_and_prune(tmp_path: Path) -> None:
    for step in (3, 10, 7):
        save_checkpoint(tmp_path, _state(step), run_id="r1")
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "outer-00000010.safetensors"
    loaded = load_checkpoint(path, run_id="r1")
    assert loaded.step == 10 and loaded.hash() == _state(10).hash()
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "outer-00000007.safetensors",
        "outer-00000010.safetensors",
    ]
    assert latest_checkpoint(tmp_path / "missing") is None


def test_refuses_corrupt_and_foreign_checkpoints(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, _state(1), run_id="r1")
    with pytest.raises(CheckpointError, match="belongs to run"):
        load_checkpoint(path, run_id="other")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    (tmp_path / "outer-00000002.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "outer-00000002.safetensors")
