"""The membership refresher keeps a fixed rate even when DHT stores are slow (on virtual time)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from node.identity import create_identity
from node.membership import Membership
from protocol.node_record import Role
from tests.helpers.virtual_time import VirtualClockLoop


class SlowDHT:
    """Accepts every store, each after `delay_s` of loop time; records when each store began."""

    def __init__(self, delay_s: float, stores: int) -> None:
        self.delay_s = delay_s
        self.started: list[float] = []
        self.enough = asyncio.Event()
        self._stores = stores

    async def store(self, *args: object, **kwargs: object) -> bool:
        self.started.append(asyncio.get_running_loop().time())
        if len(self.started) >= self._stores:
            self.enough.set()
        await asyncio.sleep(self.delay_s)
        return True


def test_a_slow_store_does_not_push_the_next_refresh_back(tmp_path: Path) -> None:
    interval_s, store_s = 0.4, 0.3

    async def run() -> list[float]:
        dht = SlowDHT(store_s, stores=8)
        membership = Membership(
            dht,
            create_identity(tmp_path / "k.key"),
            run_id="r",
            roles=[Role.VALIDATOR],
            public_name="n",
            addresses=[],
            record_ttl_s=2 * interval_s,
            refresh_interval_s=interval_s,
            software_version="t",
            protocol_version=1,
            check_identity=False,
        )
        await membership.start()
        await dht.enough.wait()
        await membership.stop()
        return dht.started[:8]

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        started = runner.run(run())
    # a fixed delay after each store would space refreshes interval + store = 0.7 s apart, letting a
    # record of TTL 2 x interval come close to expiring; the fixed rate keeps them one interval
    # apart, from the start of the first publish on
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert gaps == pytest.approx([interval_s] * 7)
