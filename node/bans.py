"""Bans of peers that sent bad data: each ban of the same peer lasts twice as long as the last.

`on_ban(reason)` (for instance `NodeMetrics.peer_banned`) is told of every ban.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from hivemind.p2p import PeerID

logger = logging.getLogger(__name__)


@dataclass
class _BanState:
    strikes: int
    until: float


class BanList:
    """Who is banned until when, with the reasons counted."""

    def __init__(
        self,
        base_s: float,
        max_s: float,
        owner: str = "",
        on_ban: Callable[[str], None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: seconds on a monotonic clock (a test's fake one)."""
        self.base_s = base_s
        self.clock = clock
        self.max_s = max_s
        self.owner = owner
        self.on_ban = on_ban
        self._bans: dict[bytes, _BanState] = {}
        self.reasons: Counter[str] = Counter()

    def ban(self, peer: PeerID | bytes, reason: str) -> float:
        """Ban `peer` for a growing period; return the ban's length in seconds."""
        key = peer.to_bytes() if isinstance(peer, PeerID) else peer
        state = self._bans.get(key) or _BanState(strikes=0, until=0.0)
        state.strikes += 1
        # The exponent is capped: a peer that keeps offending would overflow a float (2**1024).
        duration = min(self.base_s * 2.0 ** min(state.strikes - 1, 64), self.max_s)
        state.until = self.clock() + duration
        self._bans[key] = state
        self.reasons[reason.split(":")[0]] += 1
        if self.on_ban is not None:
            self.on_ban(reason)
        logger.warning(
            "[%s] banned %s for %.0f s (strike %d): %s",
            self.owner,
            PeerID(key).to_base58()[-8:],
            duration,
            state.strikes,
            reason,
        )
        return duration

    def is_banned(self, peer: PeerID | bytes) -> bool:
        key = peer.to_bytes() if isinstance(peer, PeerID) else peer
        state = self._bans.get(key)
        return state is not None and state.until > self.clock()

    def strikes(self, peer: PeerID | bytes) -> int:
        key = peer.to_bytes() if isinstance(peer, PeerID) else peer
        state = self._bans.get(key)
        return 0 if state is None else state.strikes
