"""Helpers shared by the weight-broadcast tests (small state dicts, broadcaster set-up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from tests.broadcast.conftest import SwarmNode

CHUNK_BYTES = 16 * 1024


def make_state_dict(seed: int, total_floats: int = 160_000) -> dict[str, torch.Tensor]:
    """A small random state dict of mixed shapes and dtypes (about `4 * total_floats` bytes)."""
    generator = torch.Generator().manual_seed(seed)
    quarter = total_floats // 4
    return {
        "embed.weight": torch.randn(quarter // 64, 64, generator=generator),
        "block.0.attn.weight": torch.randn(2 * quarter, generator=generator),
        "block.0.mlp.weight": torch.randn(quarter // 8, 8, generator=generator).to(torch.bfloat16),
        "head.bias": torch.arange(1000, dtype=torch.int64),
    }


def assert_state_dicts_equal(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(left[name], right[name]), name


async def start_broadcast(
    node: SwarmNode, store_dir: Path, publishers: list[SwarmNode], **overrides: Any
) -> WeightBroadcast:
    config = BroadcastConfig(
        store_dir=store_dir,
        authorized_publishers=[p.identity.peer_id.to_base58() for p in publishers],
        chunk_bytes=CHUNK_BYTES,
        holder_refresh_s=0.5,
        request_timeout_s=10.0,
        retry_after_failure_s=1.0,
        **overrides,
    )
    return await WeightBroadcast.create(dht=node.dht, identity=node.identity, config=config)
