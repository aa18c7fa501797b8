"""The state-poisoning scenario on the averaging service, on 127.0.0.1; its test and `bench/robustness.py` run it.

Two honest `GatherAverager`s declare outer step 5 and serve the same outer state; an attacker
serves parameters of 1e4 and, with two fake trainers (fresh DHT identities that declare a round at
step 100, offering a state, and serve nothing: sybils are free), pulls the median of the declared
steps to 100, so a joiner tries the attacker first. In the `own-hash` variant the attacker is a
`GatherAverager` whose state provider serves the poisoned state at step 100 (its tensors hash to
what it advertises: one source, nobody confirms it). In `copied-hash` it copies the honest state's
hash into its declaration and answers every state request with the honest step and hash over the
poisoned tensors (`LyingStateServer`, written on `node.collective.state_wire`), so its tensors do
not hash to what it advertises.

`poisoned_swarm` yields the whole `PoisonedRun` once the joiner sees all five state sources;
`poisoned_run` yields only its joiner (the bench's view), `fetch_as_joiner` is the joiner's resync
and `poison_accepted` says whether what it fetched is anything but the honest state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hivemind
import torch
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from node.broadcast.wire import read_frame, write_frame
from node.collective import state_wire as wire
from node.collective.averager import GatherAverager
from node.collective.outer_state import OuterState
from node.collective.round_types import RoundOutcome
from node.dht_node import signing_key_of, start_loopback_dht
from node.identity import Identity
from node.signed_records import SignedRecords
from node.swarm import wait_until
from protocol.averaging_round import ROUND_DECLARATION_DOMAIN, RoundDeclaration
from protocol.dht_keys import averaging_round_key
from protocol.errors import HivenetError
from tests.helpers.gather import SHAPES as GATHER_SHAPES
from tests.helpers.gather import gather_swarm, run_round

__all__ = [
    "ATTACK_STEP",
    "HONEST",
    "HONEST_STEP",
    "POISON",
    "POISONING_VARIANTS",
    "SHAPES",
    "LyingStateServer",
    "PoisonedRun",
    "SybilStateRound",
    "advertise_fake_sources",
    "fetch_as_joiner",
    "outer_state",
    "poison_accepted",
    "poisoned_run",
    "poisoned_swarm",
    "sybil_state_round",
]

SHAPES = [torch.Size([100]), torch.Size([4, 5])]
HONEST_STEP, ATTACK_STEP = 5, 100
POISONING_VARIANTS = ("own-hash", "copied-hash")
_FAKE_DECLARATION_TTL_S = 120.0


def outer_state(value: float, step: int) -> OuterState:
    """An outer state whose parameters all equal `value` (momentum a tenth of it)."""
    params = [torch.full(s, value) for s in SHAPES]
    return OuterState(params, [torch.full(s, value / 10) for s in SHAPES], step)


HONEST = outer_state(0.5, HONEST_STEP)
POISON = outer_state(1e4, ATTACK_STEP)


class LyingStateServer:
    """Answers every request on a state service protocol with the honest step and hash over POISON's
    tensors: a well-formed header and a payload of the right size whose values do not hash to it."""

    def __init__(self) -> None:
        self.payload = bytes(wire.serialize_state(POISON, SHAPES).payload)
        self.header = wire.encode_header(HONEST_STEP, HONEST.hash(), len(self.payload))
        self.payloads_sent = 0
        """Full poisoned payloads written to a stream (a download served to its end)."""

    async def handle(
        self, _info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            frame = await read_frame(reader, wire.MAX_REQUEST_BYTES)
            if frame is None:
                return
            request = wire.parse_request(frame)
            await write_frame(writer, self.header)
            if request.kind == wire.DOWNLOAD:
                writer.write(self.payload)
                await writer.drain()
                self.payloads_sent += 1
        except Exception:  # a client that went away: nothing to do
            pass
        finally:
            writer.close()

    def take_over(self, averager: GatherAverager) -> None:
        """Serve `averager`'s state protocol from now on, in place of its own `StateService`."""
        averager.runtime.stop_service(averager.states)
        averager.runtime.call(averager.p2p.add_binary_stream_handler(averager.states.proto, self.handle))


def advertise_fake_sources(fakes: list[hivemind.DHT], prefix: str, codec: str) -> None:
    """Declare, signed by each fake (the attacker holds their keys), a round at ATTACK_STEP that serves
    a state: the fakes run no state service, but pull the median of the declared steps to ATTACK_STEP."""
    declaration = RoundDeclaration(ATTACK_STEP, POISON.hash(), codec, time.time(), serves_state=True)
    for fake in fakes:
        key = signing_key_of(fake)
        assert key is not None
        records = SignedRecords(fake, Identity(private_key=key, path=Path("/nonexistent/fake.key")))
        stored = asyncio.run(
            records.store(
                averaging_round_key(prefix),
                domain=ROUND_DECLARATION_DOMAIN,
                run_id="",
                payload=declaration.payload(),
                ttl_s=_FAKE_DECLARATION_TTL_S,
            )
        )
        if not stored:
            raise HivenetError("the DHT refused a fake round declaration")


@dataclass
class PoisonedRun:
    """The scenario of the module docstring, ready for the joiner's resync."""

    variant: str
    joiner: GatherAverager
    attacker: GatherAverager
    lying: LyingStateServer | None
    """The copied-hash attacker's state server (None in own-hash: the attacker's own StateService)."""

    @property
    def attacker_id(self) -> PeerID:
        return self.attacker.p2p.peer_id

    def attacker_served_its_state(self) -> bool:
        """Whether the attacker has sent someone its poisoned payload in full."""
        if self.lying is not None:
            return self.lying.payloads_sent > 0
        return self.attacker.states.bytes_sent >= wire.payload_bytes(SHAPES)


@contextlib.contextmanager
def poisoned_swarm(variant: str) -> Iterator[PoisonedRun]:
    """Two honest sources, the attacker (`variant` of POISONING_VARIANTS) and two fakes, as the joiner sees them."""
    if variant not in POISONING_VARIANTS:
        raise ValueError(f"unknown poisoning variant {variant!r}")
    torch.set_num_threads(1)
    with gather_swarm(4, shapes=SHAPES) as (honest0, honest1, attacker, joiner):
        first = honest0.rounds.dht
        assert first is not None
        maddrs = [str(a) for a in first.get_visible_maddrs()]
        fakes = [start_loopback_dht(maddrs) for _ in range(2)]
        try:
            for averager in (honest0, honest1):
                averager.set_state_provider(HONEST.clone)
                averager.prepare_round(HONEST_STEP, 0.0, HONEST.hash())
                averager.publish_step(HONEST_STEP)
            lying = None
            if variant == "copied-hash":
                lying = LyingStateServer()
                lying.take_over(attacker)
                attacker.prepare_round(ATTACK_STEP, 0.0, HONEST.hash())
            else:
                attacker.set_state_provider(POISON.clone)
                attacker.prepare_round(ATTACK_STEP, 0.0, POISON.hash())
                attacker.publish_step(ATTACK_STEP)
            advertise_fake_sources(fakes, joiner.rounds.prefix, joiner.rounds.codec.name)
            expected = sorted([HONEST_STEP] * 2 + [ATTACK_STEP] * 3)
            if not wait_until(lambda: sorted(joiner.peer_steps().values()) == expected, timeout_s=60):
                raise HivenetError(
                    f"the joiner did not see the five state sources within 60 s: {joiner.peer_steps()}"
                )
            yield PoisonedRun(variant, joiner, attacker, lying)
        finally:
            for fake in fakes:
                fake.shutdown()


@contextlib.contextmanager
def poisoned_run(variant: str) -> Iterator[GatherAverager]:
    """`poisoned_swarm`, yielding only its joiner."""
    with poisoned_swarm(variant) as run:
        yield run.joiner


def fetch_as_joiner(joiner: GatherAverager) -> OuterState | None:
    """The joiner's resync: whatever state it accepts from the run (None: it kept its own)."""
    return joiner.fetch_state(newer_than=0, timeout_s=10.0, wait_s=5.0)


def poison_accepted(fetched: OuterState | None) -> bool:
    """Whether the joiner took a state other than the honest one (None: it took nothing)."""
    if fetched is None:
        return False
    return (fetched.step, fetched.hash()) != (HONEST_STEP, HONEST.hash()) or any(
        float(p.abs().max()) >= 1.0 for p in fetched.params
    )


@dataclass
class SybilStateRound:
    """What two running trainers did after three fresh identities agreed on a later, poisoned state."""

    outcomes: list[RoundOutcome]
    """Their next round's outcomes."""
    offered: list[OuterState | None]
    """What a resync download would hand each of them then."""
    poisoned: OuterState


def sybil_state_round() -> SybilStateRound:
    """Two trainers average outer step 0 together; three fresh identities then declare outer step
    50 and serve one consistent poisoned state; the two run the round of outer step 1 and each looks
    for a state past it."""

    def one_round(averagers: list[GatherAverager], step: int) -> list[RoundOutcome]:
        grads = [[torch.randn(s) * 0.01 for s in GATHER_SHAPES] for _ in averagers]
        return run_round(averagers, step, grads, ["00" * 8] * len(averagers))

    with gather_swarm(5) as (a0, a1, *sybils):
        honest = [a0, a1]
        first = one_round(honest, 0)
        assert all(o.num_peers == 2 and o.in_sync for o in first), first
        poisoned = OuterState(
            [torch.full(s, 7.0) for s in GATHER_SHAPES], [torch.zeros(s) for s in GATHER_SHAPES], 50
        )
        for sybil in sybils:
            sybil.set_state_provider(poisoned.clone)
            sybil.prepare_round(50, 0.0, poisoned.hash())
            sybil.publish_step(50)
        assert wait_until(lambda: sum(v == 50 for v in a0.peer_steps().values()) == 3, timeout_s=60)
        outcomes = one_round(honest, 1)
        offered = [a.fetch_state(newer_than=1, wait_s=0.0) for a in honest]
    return SybilStateRound(outcomes, offered, poisoned)
