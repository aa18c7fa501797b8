"""The state-poisoning scenario on 127.0.0.1, shared by its test and `bench/robustness.py`.

Two honest averagers hold the same outer state at step 5; an attacker serves parameters of 1e4
and, with fake state-sharing entries in the DHT (peers that serve nothing) advertising step 100,
makes a joiner try it first. In the `own-hash` variant the attacker advertises the hash of its
poisoned state at step 100 (one source, nobody confirms it); in `copied-hash` it copies the
honest step and hash (its tensors do not hash to it). `poisoned_run` yields the joiner once it
sees all five sources, `fetch_as_joiner` is its resync and `poison_accepted` says whether what it fetched is anything but the
honest state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import torch
from hivemind import DHT
from hivemind.utils import get_dht_time

from node.averaging.averager import DiLoCoAverager
from node.averaging.declarations import Declarer
from node.averaging.outer_state import OuterState
from node.dht_node import signing_key_of, start_loopback_dht
from node.swarm import wait_until
from protocol.averager_declaration import declaration_payload
from protocol.dht_keys import all_averagers_key
from protocol.errors import HivenetError
from tests.helpers.trainers import averager_swarm

SHAPES = [torch.Size([100]), torch.Size([4, 5])]
PREFIX = "poisontest"
HONEST_STEP, ATTACK_STEP = 5, 100
POISONING_VARIANTS = ("own-hash", "copied-hash")


def outer_state(value: float, step: int) -> OuterState:
    """An outer state whose parameters all equal `value` (momentum a tenth of it)."""
    params = [torch.full(s, value) for s in SHAPES]
    return OuterState(params, [torch.full(s, value / 10) for s in SHAPES], step)


HONEST = outer_state(0.5, HONEST_STEP)
POISON = outer_state(1e4, ATTACK_STEP)


class HashCopyingAverager(DiLoCoAverager):
    """Serves the poisoned tensors under the honest step and hash."""

    def get_current_state(self):  # type: ignore[no-untyped-def]
        _, tensors, infos = super().get_current_state()
        return {"step": HONEST_STEP, "hash": HONEST.hash()}, tensors, infos


def advertise_fake_sources(fakes: list[DHT], prefix: str = PREFIX) -> None:
    """Declare peers that serve no state at the attacker's step, so the median points at the attacker.

    The attacker holds their keys (sybils are free): each declaration is signed by its fake peer.
    """
    payload = declaration_payload(shares_state=True, state_priority=float(ATTACK_STEP))
    for fake in fakes:
        key = signing_key_of(fake)
        assert key is not None
        declare = Declarer(fake, key).declare(all_averagers_key(prefix), get_dht_time() + 120, payload)
        if not asyncio.run(declare):
            raise HivenetError("the DHT refused a fake state-sharing declaration")


@contextlib.contextmanager
def poisoned_run(variant: str) -> Iterator[DiLoCoAverager]:
    """Two honest sources, the attacker (`variant` of POISONING_VARIANTS) and two fakes; yields the joiner."""
    if variant not in POISONING_VARIANTS:
        raise ValueError(f"unknown poisoning variant {variant!r}")
    torch.set_num_threads(1)
    attacker_class = HashCopyingAverager if variant == "copied-hash" else DiLoCoAverager
    classes = [DiLoCoAverager, DiLoCoAverager, attacker_class, DiLoCoAverager]
    with averager_swarm(SHAPES, classes, prefix=PREFIX) as (honest0, honest1, attacker, joiner):
        maddrs = [str(a) for a in honest0.dht.get_visible_maddrs()]
        fakes = [start_loopback_dht(maddrs) for _ in range(2)]
        try:
            for averager in (honest0, honest1):
                averager.set_state_provider(HONEST.clone)
                averager.publish_step(HONEST_STEP)
            attacker.set_state_provider(POISON.clone)
            attacker.publish_step(ATTACK_STEP)
            advertise_fake_sources(fakes)
            expected = {HONEST_STEP, ATTACK_STEP}
            if not wait_until(
                lambda: set(joiner.peer_steps().values()) == expected and len(joiner.peer_steps()) == 5,
                timeout_s=60,
            ):
                raise HivenetError("the joiner did not see the five state sources within 60 s")
            yield joiner
        finally:
            for fake in fakes:
                fake.shutdown()


def fetch_as_joiner(joiner: DiLoCoAverager) -> OuterState | None:
    """The joiner's resync: whatever state it accepts from the run (None: it kept its own)."""
    return joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=5.0)


def poison_accepted(fetched: OuterState | None) -> bool:
    """Whether the joiner took a state other than the honest one (None: it took nothing)."""
    if fetched is None:
        return False
    return (fetched.step, fetched.hash()) != (HONEST_STEP, HONEST.hash()) or any(
        float(p.abs().max()) >= 1.0 for p in fetched.params
    )
