"""The averager of a DiLoCo trainer, built from its run's config.

`make_averager` (a language-model trainer) and `rl_averager` (an RL trainer) return the
node's averaging service as a trainer uses it (`node.collective.averager.GatherAverager`): the
trainer's `RoundAverager` and `StateSource`, serving its state (`set_state_provider`,
`publish_step`, `peer_steps`, `cancel_round`, `shutdown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from hivemind import DHT
from hivemind.p2p import PeerID

from node.collective.averager import GatherAverager
from node.collective.codecs import PseudoGradCodec, codec_for
from node.collective.config import AveragingConfig
from protocol.dht_keys import averaging_prefix

if TYPE_CHECKING:
    from training.rl_run import RLDiLoCoConfig
    from training.trainer import TrainerConfig

__all__ = ["make_averager", "rl_averager"]


def _averager(
    *,
    dht: DHT,
    run_id: str,
    name: str,
    shapes: Sequence[torch.Size],
    codec: PseudoGradCodec,
    timing: RLDiLoCoConfig | TrainerConfig,
    authorized_publishers: Sequence[str],
    admitted_trainers: Sequence[str],
    **settings: Any,
) -> GatherAverager:
    """A `GatherAverager` whose round timing and group size follow `timing` (a trainer's or an RL
    run's DiLoCo settings), with the other `AveragingConfig` fields in `settings`."""
    config = AveragingConfig(
        max_group_size=timing.max_group_size,
        min_gather_s=timing.matchmaking_time_s,
        gather_timeout_s=timing.averaging_timeout_s,
        averaging_timeout_s=timing.averaging_timeout_s + timing.sender_timeout_s,
        commit_timeout_s=timing.sender_timeout_s,
        request_timeout_s=timing.sender_timeout_s,
        max_norm_ratio=timing.max_norm_ratio,
        **settings,
    )
    return GatherAverager(
        shapes,
        dht,
        prefix=averaging_prefix(run_id),
        codec=codec,
        config=config,
        trusted_state_sources=[PeerID.from_base58(p) for p in authorized_publishers],
        admitted_trainers=[PeerID.from_base58(p) for p in admitted_trainers],
        name=name,
    )


def make_averager(config: TrainerConfig, dht: DHT, name: str, shapes: Sequence[torch.Size]) -> GatherAverager:
    """The averager of a trainer of `config`'s run, on `dht`."""
    codec = codec_for(
        config.compression, shapes, density=config.sparse_density, chunk_values=config.sparse_chunk_values
    )
    return _averager(
        dht=dht,
        run_id=config.run_id,
        name=name,
        shapes=shapes,
        codec=codec,
        timing=config,
        authorized_publishers=config.authorized_publishers,
        admitted_trainers=config.admitted_trainers,
        aggregation=config.aggregation,
        ban_base_s=config.ban_base_s,
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
    return _averager(
        dht=dht,
        run_id=run_id,
        name=name,
        shapes=shapes,
        codec=codec_for(config.compression, shapes),
        timing=config,
        authorized_publishers=authorized_publishers,
        admitted_trainers=admitted_trainers,
        min_norm_per_value=min_norm_per_value,
    )
