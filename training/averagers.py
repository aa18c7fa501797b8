"""Which averager a DiLoCo trainer runs, built from its config.

`make_averager` returns an object that is the trainer's `RoundAverager` and `StateSource` and
serves its state (`set_state_provider`, `publish_step`, `peer_steps`, `cancel_round`,
`shutdown`): hivemind's all-reduce (`node.averaging.averager.DiLoCoAverager`, an averager
process of its own) or the node's averaging service (`node.collective.averager.GatherAverager`,
on an event loop in the trainer's process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from hivemind import DHT
from hivemind.p2p import PeerID

from node.averaging.averager import DiLoCoAverager
from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from protocol.dht_keys import averaging_prefix

if TYPE_CHECKING:
    from training.trainer import TrainerConfig

__all__ = ["make_averager"]


def make_averager(config: TrainerConfig, dht: DHT, name: str, shapes: Sequence[torch.Size]) -> Any:
    """The averager `config.averager` names, started on `dht` (call in the thread that owns the process)."""
    publishers = [PeerID.from_base58(p) for p in config.authorized_publishers]
    admitted = [PeerID.from_base58(p) for p in config.admitted_trainers]
    prefix = averaging_prefix(config.run_id)
    if config.averager == "gather":
        codec = codec_for(
            config.compression, shapes, density=config.sparse_density, chunk_values=config.sparse_chunk_values
        )
        settings = AveragingConfig(
            min_gather_s=config.matchmaking_time_s,
            gather_timeout_s=config.averaging_timeout_s,
            averaging_timeout_s=config.averaging_timeout_s + config.sender_timeout_s,
            commit_timeout_s=config.sender_timeout_s,
            request_timeout_s=config.sender_timeout_s,
            max_norm_ratio=config.max_norm_ratio,
            aggregation=config.aggregation,
            ban_base_s=config.ban_base_s,
        )
        return GatherAverager(
            shapes,
            dht,
            prefix=prefix,
            codec=codec,
            config=settings,
            trusted_state_sources=publishers,
            admitted_trainers=admitted,
            name=name,
        )
    return DiLoCoAverager(
        list(shapes),
        dht,
        prefix=prefix,
        compression=config.compression,
        max_norm_ratio=config.max_norm_ratio,
        ban_base_s=config.ban_base_s,
        matchmaking_time_s=config.matchmaking_time_s,
        request_timeout_s=config.request_timeout_s,
        averaging_timeout_s=config.averaging_timeout_s,
        sender_timeout_s=config.sender_timeout_s,
        reducer_timeout_s=config.reducer_timeout_s,
        target_group_size=config.target_group_size,
        name=name,
        aggregation=config.aggregation,
        audit_reducers=config.audit_reducers,
        trusted_state_sources=publishers,
        admitted_trainers=admitted,
    )
