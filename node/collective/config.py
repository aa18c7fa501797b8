"""Settings of the averaging service (`node.collective.service.AveragingService`)."""

from __future__ import annotations

from pydantic import Field

from node.collective.rules import DEFAULT_RULE, AggregationRule
from node.rollouts.config import StreamServiceConfig

__all__ = ["AveragingConfig"]


class AveragingConfig(StreamServiceConfig):
    """How a trainer forms its rounds and how its averaging streams are limited."""

    max_group_size: int = Field(default=32, ge=2, le=256)
    """Most members of one round (this trainer included); peers beyond are not contacted."""
    min_gather_s: float = Field(default=2.0, ge=0)
    """A gather stays open at least this long, so that trainers that declared the round late (joiners)
    are found and included; with overlapping rounds it costs a trainer no compute."""
    gather_timeout_s: float = Field(default=30.0, gt=0)
    """How long past the latest gather time its members declared a round waits for their contributions."""
    commit_timeout_s: float = Field(default=10.0, gt=0)
    """How long past the gather a round waits for the members' commits."""
    averaging_timeout_s: float = Field(default=120.0, gt=0)
    """Longest a round may take from its start, whatever its members declared."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """Longest one exchange with one peer (dial, send, answer) may take."""
    declaration_ttl_s: float = Field(default=15.0, ge=3)
    """How long a round declaration stays valid; it is renewed every third of this while the trainer
    lives. A dead trainer's declaration lingers this long: its step still counts for the run's
    median (which joiners wait on) and its state is still tried, so it must be short."""
    max_norm_ratio: float | None = Field(default=None, gt=1)
    """Refuse a contribution whose norm exceeds this multiple of the median norm (None: no cap)."""
    min_norm_per_value: float = Field(default=0.0, ge=0)
    """The norm cap's floor, per value: the cap is never below `max_norm_ratio` times this times the
    square root of the number of values."""
    aggregation: AggregationRule = DEFAULT_RULE
    """How every member combines the round's contributions (`node.collective.aggregate`)."""
    max_streams: int = Field(default=64, ge=1)
    max_streams_per_peer: int = Field(default=4, ge=1)
    frame_timeout_s: float = Field(default=30.0, gt=0)
