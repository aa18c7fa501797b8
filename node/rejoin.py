"""Coming back after a network outage: a node whose DHT has lost every peer dials its seeds again.

hivemind's DHT bootstraps once. While a node's link is down, every request it sends times out and
its routing table drops the peer it went to; once the link is back the table is empty, every store
lands only in the node's own storage, and the node trains, validates or serves alone without
noticing. `Rejoin` checks at each interval whether the DHT still finds any peer and, when it finds
none, dials the initial peers again (`node.dht_node.bootstrap`), which refills the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import hivemind
from hivemind.dht.node import DHTNode

logger = logging.getLogger(__name__)

MIN_REJOIN_CHECK_INTERVAL_S = 10.0
"""Each check is a DHT lookup: at most one per this many seconds, however fast records refresh."""


async def count_dht_neighbours(_dht: hivemind.DHT, node: DHTNode) -> int:
    """How many other DHT peers a lookup of this node's own ID finds (run via `in_dht`)."""
    nearest = await node.find_nearest_nodes([node.node_id], exclude_self=True)
    return len(nearest.get(node.node_id, {}))


class Rejoin:
    """Dials the seeds again whenever the DHT finds no peer; a runtime service (`node.runtime`)."""

    name = "rejoin"

    def __init__(
        self,
        neighbours: Callable[[], Awaitable[int]],
        redial: Callable[[], Awaitable[object]],
        *,
        interval_s: float,
        owner: str = "",
    ) -> None:
        """`neighbours`: how many DHT peers the node still finds; `redial`: dial the initial peers
        (raising if none answers)."""
        self.neighbours = neighbours
        self.redial = redial
        self.interval_s = interval_s
        self.owner = owner
        self.isolated = False
        """Whether the last check found no DHT peer (and the seeds did not answer since)."""
        self.rejoins = 0
        """Outages this node came back from."""
        self.checks = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="rejoin")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once()

    async def check_once(self) -> None:
        """Count the DHT's peers; with none, dial the seeds again."""
        self.checks += 1
        try:
            found = await asyncio.wait_for(self.neighbours(), timeout=self.interval_s)
        except Exception as exc:  # a lookup that times out says nothing either way
            logger.debug("[%s] could not count DHT peers: %r", self.owner, exc)
            return
        if found > 0:
            if self.isolated:  # peers found it again before a seed answered us
                self._back(f"found {found} DHT peer(s) again")
            return
        if not self.isolated:
            logger.warning(
                "[%s] this node lost every DHT peer (network down?); dialling the seeds again", self.owner
            )
        self.isolated = True
        try:
            await self.redial()
        except Exception as exc:
            logger.info(
                "[%s] seeds still unreachable (%s); will retry", self.owner, str(exc).splitlines()[0][:200]
            )
            return
        self._back("reached a seed again")

    def _back(self, how: str) -> None:
        self.isolated = False
        self.rejoins += 1
        logger.warning("[%s] back in the swarm: %s", self.owner, how)
