"""The membership refresher keeps a fixed rate even when DHT stores are slow."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from node.identity import create_identity
from node.membership import Membership
from protocol.node_record import Role


class SlowDHT:
    """Accepts every store, each after `delay_s`; records when each store began."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.started: list[float] = []

    async def store(self, *args: object, **kwargs: object) -> bool:
        self.started.append(time.monotonic())
        await asyncio.sleep(self.delay_s)
        return True


def test_a_slow_store_does_not_push_the_next_refresh_back(tmp_path: Path) -> None:
    interval_s, store_s = 0.4, 0.3
    dht = SlowDHT(store_s)
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

    async def run() -> None:
        await membership.start()
        await asyncio.sleep(8 * interval_s)
        await membership.stop()

    asyncio.run(run())
    gaps = [b - a for a, b in zip(dht.started, dht.started[1:-1], strict=False)]
    # a fixed delay after each store would space refreshes interval + store = 0.7 s apart, letting a
    # record of TTL 2 x interval come close to expiring; the fixed rate keeps them one interval apart
    assert len(gaps) >= 4
    assert sorted(gaps)[len(gaps) // 2] < interval_s + store_s / 2
