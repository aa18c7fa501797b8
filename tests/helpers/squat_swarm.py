"""The swarm that the DHT squatting attacks (`tests.helpers.squatting`) run against, and the squat itself.

`SquatSwarm` has two honest nodes on 127.0.0.1 with the production validator and DHT guard, a
publisher and a follower, each also hosting one averager (started on first use), and brings a
fresh attacker for every attack: a plain `hivemind.DHT` without any record validator, which keeps
its squats itself and serves them. `squat` writes the three squats of a key (a plain value, the
same value under an honest peer's subkey, 1 MiB), 31 years each; `squats_kept` counts what honest
nodes kept of them (storage or cache) or return from a lookup. `SquatOutcome` is what one attack
achieved.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import hivemind
import torch
from hivemind import DHT
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils import get_dht_time

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.config import AveragingConfig
from tests.helpers.broadcast import Swarm

SQUAT_TTL_S = 31 * 365 * 86400.0
SQUAT_MARKER = b"squatted"
HUGE_SQUAT_BYTES = 1 << 20
LARGE_VALUES, LARGE_VALUE_BYTES = 64, 1 << 20
AVERAGER_SHAPES = [torch.Size([64]), torch.Size([4, 4])]
AVERAGER_PREFIX = "squattest"
AVERAGER_SETTINGS = AveragingConfig(
    min_gather_s=1.0,
    gather_timeout_s=20.0,
    commit_timeout_s=5.0,
    averaging_timeout_s=40.0,
    request_timeout_s=5.0,
)


@dataclass
class SquatOutcome:
    """What one squatting attack achieved."""

    attack: str
    squats_kept: int
    """Squatted values that an honest node kept (storage or cache) or returned from a lookup."""
    honest_ok: bool
    """Whether the honest operation the squat targets still worked afterwards."""
    detail: str

    @property
    def survived(self) -> bool:
        return self.squats_kept == 0 and self.honest_ok


# ---- the squat itself and what honest nodes kept of it ---------------------------------------


async def _store_in_dht(_dht: Any, node: Any, key: str, value: bytes | int, expiration: float) -> bool:
    """`dht.store(key, value)` inside the DHT process: hivemind's pipe to it breaks on values over 64 KiB,
    so a huge value (given as its size) is built there."""
    if isinstance(value, int):
        value = SQUAT_MARKER * (value // len(SQUAT_MARKER))
    return bool(await node.store(key, value, expiration))


async def squat(attacker: DHT, key: str, honest_subkey: Any) -> None:
    """The three squats of `key` (plain value, an honest peer's subkey, 1 MiB), 31 years each."""
    expires = get_dht_time() + SQUAT_TTL_S
    await attacker.store(key, SQUAT_MARKER, expires, return_future=True)
    await attacker.store(key, SQUAT_MARKER, expires, subkey=honest_subkey, return_future=True)
    huge = partial(_store_in_dht, key=key, value=HUGE_SQUAT_BYTES, expiration=expires)
    await attacker.run_coroutine(huge, return_future=True)


def _holds_marker(value: Any) -> bool:
    return isinstance(value, bytes) and SQUAT_MARKER in value


async def _squats_held_locally(_dht: Any, node: Any, key: str) -> int:
    """Squatted values in this DHT node's storage and cache (run in its DHT process)."""
    key_id = DHTID.generate(source=key)
    held = 0
    for local in (node.protocol.storage, node.protocol.cache):
        found = local.get(key_id)
        if found is None:
            continue
        if isinstance(found.value, DictionaryDHTValue):
            held += sum(_holds_marker(item.value) for _, item in found.value.items())
        else:
            held += _holds_marker(found.value)
    return held


async def squats_kept(honest: Sequence[DHT], key: str) -> int:
    """Squatted values under `key` that honest nodes hold locally or return from a lookup."""
    kept = 0
    for dht in honest:
        kept += await dht.run_coroutine(partial(_squats_held_locally, key=key), return_future=True)
        found = await dht.get(key, latest=True, return_future=True)
        if found is None:
            continue
        if isinstance(found.value, dict):
            kept += sum(_holds_marker(item.value) for item in found.value.values())
        else:
            kept += _holds_marker(found.value)
    return kept


# ---- the swarm -------------------------------------------------------------------------------


class SquatSwarm:
    """Two honest nodes on 127.0.0.1 (publisher and follower), their averagers, fresh attackers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.swarm = Swarm(root)
        self.averagers: list[GatherAverager] = []
        self._serial = itertools.count()
        try:
            self.publisher = self.swarm.add()
            self.follower = self.swarm.add()
        except BaseException:
            self.close()
            raise

    @property
    def honest(self) -> list[DHT]:
        return [self.publisher.dht, self.follower.dht]

    def fresh_name(self, what: str) -> str:
        """A run id (or directory name) no earlier attack used."""
        return f"{what}-{next(self._serial)}"

    @contextlib.contextmanager
    def attacker(self) -> Iterator[DHT]:
        """A plain hivemind DHT (no record validator) that joined the swarm; shut down afterwards."""
        maddrs = [str(a) for a in self.publisher.dht.get_visible_maddrs()]
        dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs)
        try:
            yield dht
        finally:
            dht.shutdown()

    def start_averagers(self) -> list[GatherAverager]:
        """One averager on each honest node (started once)."""
        if not self.averagers:
            for index, node in enumerate((self.publisher, self.follower)):
                self.averagers.append(
                    GatherAverager(
                        AVERAGER_SHAPES,
                        node.dht,
                        prefix=AVERAGER_PREFIX,
                        codec=codec_for("int8", AVERAGER_SHAPES),
                        config=AVERAGER_SETTINGS,
                        name=f"peer{index}",
                    )
                )
        return self.averagers

    def close(self) -> None:
        for averager in self.averagers:
            with contextlib.suppress(Exception):
                averager.shutdown()
        self.swarm.close()


@contextlib.contextmanager
def open_squat_swarm(root: Path) -> Iterator[SquatSwarm]:
    swarm = SquatSwarm(root)
    try:
        yield swarm
    finally:
        swarm.close()
