"""The averager of a DiLoCo trainer, built from its run's config.

`make_averager` (a language-model trainer) and `rl_averager` (an RL trainer) return the
node's averaging service as a trainer uses it (`node.collective.averager.GatherAverager`): the
trainer's `RoundAverager` and `StateSource`, serving its state (`set_state_provider`,
`publish_step`, `peer_steps`, `cancel_round`, `shutdown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from hivemind import DHT
from hivemind.p2p import PeerID

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from protocol.dht_keys import averaging_prefix

if TYPE_CHECKING:
    from training.rl_run import RLDiLoCoConfig
    from training.trainer import TrainerConfig

__all__ = ["make_averager", "rl_averager"]


def _peer_ids(base58: Sequence[str]) -> list[PeerID]:
    return [PeerID.from_base58(p) for p in base58]


def make_averager(config: TrainerConfig, dht: DHT, name: str, shapes: Sequence[torch.Size]) -> GatherAverager:
    """The averager of a trainer of `config`'s run, on `dht`."""
    codec = codec_for(
        config.compression, shapes, density=config.sparse_density, chunk_values=config.sparse_chunk_values
    )
    settings = AveragingConfig(
        max_group_size=config.max_group_size,
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
        prefix=averaging_prefix(config.run_id),
        codec=codec,
        config=settings,
        trusted_state_sources=_peer_ids(config.authorized_publishers),
        admitted_trainers=_peer_ids(config.admitted_trainers),
        name=name,
    )


def rl_averager(
    config: RLDiLoCoConfig,
    dht: DHT,
    *,
    run_id: str,
    name: str,
    shapes: Sequence[torch.Size],
    min_norm_per_value: float,
    authorized_publishers: Sequence[str] = (),
    admitted_trainers: Sequence[str] = (),
) -> GatherAverager:
    """The averager of an RL trainer of run `run_id` averaging with `config`, on `dht`."""
    settings = AveragingConfig(
        max_group_size=config.max_group_size,
        min_gather_s=config.matchmaking_time_s,
        gather_timeout_s=config.averaging_timeout_s,
        averaging_timeout_s=config.averaging_timeout_s + config.sender_timeout_s,
        commit_timeout_s=config.sender_timeout_s,
        request_timeout_s=config.sender_timeout_s,
        max_norm_ratio=config.max_norm_ratio,
        min_norm_per_value=min_norm_per_value,
    )
    return GatherAverager(
        shapes,
        dht,
        prefix=averaging_prefix(run_id),
        codec=codec_for(config.compression, shapes),
        config=settings,
        trusted_state_sources=_peer_ids(authorized_publishers),
        admitted_trainers=_peer_ids(admitted_trainers),
        name=name,
    )
