"""An outer-state download flood (#30 item 4): fresh identities hammering a trainer's state service.

`state_flood(victim, proto, shapes, initial_peers, identities=4, streams=4)` starts `identities`
fresh identities on 127.0.0.1, each a loopback DHT of its own (so its own PeerID and p2pd) joined
to `initial_peers` (give the victim's own addresses: its p2pd is then connected to the victim),
with a replicated P2P client of that daemon. On an event loop of its own, each identity runs
`streams` concurrent loops, each asking the victim's `StateService` protocol
(`GatherAverager.states.proto`) for its full state (a download newer than step -1) through the
client's `StateService.query`, reading the answer to its end and asking again at once, whatever
the victim said: an attacker ignores "try again in N s". The loops run until the context exits
(or between `StateFlood.start` and `StateFlood.pause`).

Each identity counts the full states it received, the bytes it received, the victim's refusals by
reason (`refusal_reason` maps the victim's error text onto the reasons of `StateService.refusals`;
the stream caps of requests and downloads answer the same text, counted as "streams") and the
requests that got no answer (`unavailable`) or broke the protocol (`invalid`). `FloodStats` is
a consistent copy of those counters, taken on the flood's loop; a test waits on it (never on a
sleep). Closing the context cancels every loop, then shuts the clients and the DHTs down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import hivemind
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.collective.state_service import SourceUnavailable, StateService, StateServiceConfig
from node.dht_node import start_loopback_dht
from node.rollouts.peers import replicate_p2p
from node.runtime import NodeRuntime
from protocol.errors import InvalidMessage

__all__ = ["Attacker", "FloodStats", "StateFlood", "refusal_reason", "state_flood"]

_FAILURE_PAUSE_S = 0.05
"""After a request that got no answer at all: a victim gone must not turn the loops into a busy spin."""

_REASONS = (
    ("busy: state upload budget spent", "download_budget"),
    ("busy: state request budget spent", "request_budget"),
    ("busy: preempted", "preempted"),
    ("busy:", "streams"),
    ("timed out", "timeout"),
    ("refused", "banned"),
    ("stale", "stale"),
    ("no state", "no_state"),
)


def refusal_reason(error: str) -> str:
    """The reason of a `StateService` refusal from its error text ("other" if it is none known)."""
    for prefix, reason in _REASONS:
        if error.startswith(prefix):
            return reason
    return "other"


@dataclass
class Attacker:
    """One identity of the flood and what it got so far (counters updated on the flood's loop)."""

    peer_id: PeerID
    dht: hivemind.DHT
    client: StateService
    p2p: P2P
    requests: int = 0
    downloads: int = 0
    """Full states received (an OK header, then every payload byte)."""
    refusals: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    """Requests without an answer ("unavailable") or with one that broke the protocol ("invalid")."""


@dataclass(frozen=True)
class FloodStats:
    """A copy of the flood's counters; per identity, in the order of `StateFlood.attackers`."""

    requests: tuple[int, ...]
    downloads: tuple[int, ...]
    bytes_received: tuple[int, ...]
    refusals: tuple[Counter[str], ...]
    failures: tuple[Counter[str], ...]

    @property
    def total_requests(self) -> int:
        return sum(self.requests)

    @property
    def total_downloads(self) -> int:
        return sum(self.downloads)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_received)

    @property
    def total_refusals(self) -> Counter[str]:
        return sum(self.refusals, Counter())

    @property
    def total_failures(self) -> Counter[str]:
        return sum(self.failures, Counter())


class StateFlood:
    """A running flood (see the module docstring); built and ended by `state_flood`."""

    def __init__(
        self,
        victim: PeerID,
        proto: str,
        shapes: Sequence[Sequence[int]],
        *,
        streams: int,
        timeout_s: float,
        runtime: NodeRuntime,
    ) -> None:
        self.victim, self.proto, self.shapes = victim, proto, [tuple(s) for s in shapes]
        self.streams, self.timeout_s, self.runtime = streams, timeout_s, runtime
        self.attackers: list[Attacker] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._final: FloodStats | None = None

    def add_identity(self, dht: hivemind.DHT) -> Attacker:
        """Arm `dht`'s identity (a replicated client of its daemon); its loops start with `start`."""
        p2p = self.runtime.call(replicate_p2p(dht), timeout_s=60)
        client = StateService(
            p2p,
            proto=self.proto,
            shapes=self.shapes,
            config=StateServiceConfig(),
            bans=BanList(1.0, 1.0, owner="flood"),  # never consulted: the client only queries
            label=f"flood-{len(self.attackers)}",
        )
        attacker = Attacker(dht.peer_id, dht, client, p2p)
        self.attackers.append(attacker)
        return attacker

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        """Start every identity's loops (a no-op while they run); counters go on from where they were."""
        if self._final is not None:
            raise RuntimeError("this flood has ended")
        self.runtime.call(self._start(), timeout_s=30)

    async def _start(self) -> None:
        if self._tasks:
            return
        for attacker in self.attackers:
            for _ in range(self.streams):
                self._tasks.append(asyncio.ensure_future(self._hammer(attacker)))

    def pause(self) -> FloodStats:
        """End every loop for now (a request in flight is cancelled); the counters at that point."""
        if self._final is not None:
            return self._final
        return self.runtime.call(self._pause(), timeout_s=60)

    async def _pause(self) -> FloodStats:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return await self._snapshot()

    async def _hammer(self, attacker: Attacker) -> None:
        while True:
            attacker.requests += 1
            try:
                header, payload = await attacker.client.query(
                    self.victim, download=True, newer_than=-1, timeout_s=self.timeout_s
                )
            except InvalidMessage:
                attacker.failures["invalid"] += 1
                await asyncio.sleep(_FAILURE_PAUSE_S)
            except SourceUnavailable:
                attacker.failures["unavailable"] += 1
                await asyncio.sleep(_FAILURE_PAUSE_S)
            else:
                if header.error:
                    attacker.refusals[refusal_reason(header.error)] += 1
                elif payload is not None:
                    attacker.downloads += 1
                await asyncio.sleep(0)  # let the other loops and the clients' I/O in

    async def _snapshot(self) -> FloodStats:
        return FloodStats(
            requests=tuple(a.requests for a in self.attackers),
            downloads=tuple(a.downloads for a in self.attackers),
            bytes_received=tuple(a.client.bytes_received for a in self.attackers),
            refusals=tuple(Counter(a.refusals) for a in self.attackers),
            failures=tuple(Counter(a.failures) for a in self.attackers),
        )

    def stats(self) -> FloodStats:
        """The counters now (or as the flood ended, once it did)."""
        if self._final is not None:
            return self._final
        return self.runtime.call(self._snapshot(), timeout_s=30)

    def stop(self) -> FloodStats:
        """End the flood for good (`pause`, then the counters are frozen); the final counters. Idempotent."""
        if self._final is None:
            self._final = self.pause()
        return self._final


@contextlib.contextmanager
def state_flood(
    victim: PeerID,
    proto: str,
    shapes: Sequence[Sequence[int]],
    initial_peers: Sequence[str],
    *,
    identities: int = 4,
    streams: int = 4,
    timeout_s: float = 30.0,
    start: bool = True,
) -> Iterator[StateFlood]:
    """Flood `victim`'s state service from `identities` fresh identities of `streams` streams each,
    for the duration of the context (see the module docstring). `timeout_s` bounds one request.
    With `start=False` the identities are ready but idle until `StateFlood.start` (a benchmark
    alternating phases with and without the flood calls `start` and `pause`)."""
    if identities < 1 or streams < 1:
        raise ValueError("a flood needs at least one identity and one stream")
    runtime = NodeRuntime("state-flood").start()
    flood = StateFlood(victim, proto, shapes, streams=streams, timeout_s=timeout_s, runtime=runtime)
    dhts: list[hivemind.DHT] = []
    try:
        for _ in range(identities):
            dhts.append(start_loopback_dht(list(initial_peers)))
            flood.add_identity(dhts[-1])
        if start:
            flood.start()
        yield flood
    finally:
        with contextlib.suppress(Exception):
            flood.stop()
        for attacker in flood.attackers:
            with contextlib.suppress(Exception):
                runtime.call(attacker.p2p.shutdown(), timeout_s=10)
        runtime.close()
        for dht in dhts:
            with contextlib.suppress(Exception):
                dht.shutdown()
