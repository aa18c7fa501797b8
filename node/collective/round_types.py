"""What a DiLoCo trainer gets back from an averaging round: `RoundOutcome`, and a round in flight.

`PendingAverage` is a round in flight (`node.collective.averager.GatherAverager` returns one);
`DoneAverage` is one whose outcome was known at once (e.g. no peer around).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

__all__ = ["DoneAverage", "PendingAverage", "RoundOutcome"]


@dataclass
class RoundOutcome:
    """What one averaging round gave this peer."""

    averaged: list[torch.Tensor] | None
    """The group's aggregate pseudo-gradient (identical on every member), or None if no round took place."""

    num_peers: int
    """Peers whose contribution is in the aggregate (1 if this peer averaged alone)."""

    in_sync: bool = True
    """False if this peer's outer state hash disagreed with the majority of its group, or if most live
    peers had moved past its round (it is behind the run): in either case it must resync."""

    refused_peers: int = 0
    """Senders whose contributions were refused (malformed, undecodable or over the norm cap) in this round."""

    round_id: bytes = b""
    """The round's id (empty if no round took place): the evidence of a training receipt."""

    received_bytes: dict[bytes, int] = field(default_factory=dict)
    """Bytes received from each other member whose contribution was aggregated (PeerID bytes): the
    members this peer can sign a training receipt for."""


class PendingAverage(Protocol):
    """An averaging round in flight."""

    def done(self) -> bool:
        """Whether `result` would return at once."""
        ...

    def result(self) -> RoundOutcome:
        """Wait for the round and return its outcome (never raises: a failed round is averaged alone)."""
        ...


class DoneAverage:
    """A `PendingAverage` whose outcome is already known."""

    def __init__(self, outcome: RoundOutcome) -> None:
        self.outcome = outcome

    def done(self) -> bool:
        return True

    def result(self) -> RoundOutcome:
        return self.outcome
