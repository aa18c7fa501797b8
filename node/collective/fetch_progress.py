"""What a download of the run's state carries from one poll to the next, and what it returns.

A trainer that needs the run's state (a joiner, a member a round left out of sync) polls
`StateService.fetch` until two witnesses agree or its wait ends. `FetchProgress` is the memory of
those polls:

- the states already downloaded but not yet confirmed (`held`), so each is downloaded once;
- who vouched for which (step, hash), by serving or offering it. A voucher stays evidence for the
  whole download: peers move on to the next outer step at different moments, so two witnesses of
  one state are often asked a poll apart;
- when each peer may be asked again. Every source meters its requests per peer
  (`StateServiceConfig.offers_per_peer_per_window`), and a peer that asks past its budget is
  answered "busy" and then not at all for the rest of the window; a poller that ignored this
  would lose its sources exactly when it needs them. So a peer is asked at most once per
  `ask_interval_s`, and a "busy: ... try again in N s" keeps it unasked for N s (capped).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hivemind.p2p import PeerID

from node.collective.outer_state import OuterState

__all__ = ["FetchProgress", "FetchResult", "Offer", "StateKey", "retry_after_s"]

StateKey = tuple[int, str]
"""(outer step, state hash)."""

_RETRY_AFTER = re.compile(r"try again in (\d{1,6}) s")
_MAX_VOUCHED_STATES = 64
"""Most (step, hash) keys whose vouchers are remembered: a liar's ever-new states are not hoarded."""


@dataclass(frozen=True)
class Offer:
    """A verified state nobody confirmed: who served it, at which step, with which hash."""

    source: PeerID
    step: int
    hash: str


@dataclass(frozen=True)
class FetchResult:
    """The outcome of `StateService.fetch`: "agreed" (`source`, `state`), "unconfirmed" (`offers`) or
    "none" (no peer served a verified state)."""

    verdict: Literal["agreed", "unconfirmed", "none"]
    source: PeerID | None = None
    state: OuterState | None = None
    offers: tuple[Offer, ...] = ()


def retry_after_s(error: str) -> float | None:
    """The wait a source asked for in a "busy" answer ("... try again in N s"), if it named one."""
    match = _RETRY_AFTER.search(error)
    return float(match.group(1)) if match else None


class FetchProgress:
    """The unconfirmed states, vouchers and per-peer pacing of one download (module docstring)."""

    def __init__(
        self,
        *,
        ask_interval_s: float,
        max_wait_s: float,
        max_held: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ask_interval_s = ask_interval_s
        self.max_wait_s = max_wait_s
        self.max_held = max_held
        """Most unconfirmed states kept (each is a whole outer state; a liar's ever-new ones are dropped)."""
        self.clock = clock
        self.held: dict[StateKey, tuple[PeerID, OuterState]] = {}
        self.vouchers: dict[StateKey, set[bytes]] = {}
        self._next_ask: dict[bytes, float] = {}

    def may_ask(self, peer: bytes) -> bool:
        return self.clock() >= self._next_ask.get(peer, float("-inf"))

    def asked(self, peer: bytes, error: str = "") -> None:
        """`peer` was just sent a request (and answered `error`, if it did)."""
        wait = self.ask_interval_s
        asked_for = retry_after_s(error)
        if asked_for is not None:
            wait = max(wait, min(asked_for, self.max_wait_s))
        self._next_ask[peer] = self.clock() + wait

    def hold(self, key: StateKey, source: PeerID, state: OuterState) -> None:
        self.held.setdefault(key, (source, state))
        while len(self.held) > self.max_held:
            del self.held[next(iter(self.held))]

    def vouch(self, key: StateKey, peer: bytes) -> None:
        self.vouchers.setdefault(key, set()).add(peer)
        while len(self.vouchers) > _MAX_VOUCHED_STATES:
            del self.vouchers[next(iter(self.vouchers))]

    def withdraw(self, peer: bytes) -> None:
        """Forget every voucher of `peer` (it broke the protocol)."""
        for vouched in self.vouchers.values():
            vouched.discard(peer)

    def confirmed(self, counts_as_witness: Callable[[bytes], bool]) -> tuple[StateKey, int] | None:
        """A held state that two peers counting as witnesses vouch for, and how many do."""
        for key in self.held:
            witnesses = [p for p in self.vouchers.get(key, ()) if counts_as_witness(p)]
            if len(witnesses) >= 2:
                return key, len(witnesses)
        return None
