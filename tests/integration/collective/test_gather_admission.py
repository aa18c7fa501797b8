"""A run that names its trainers averages only with them: an outsider cannot join their round or move their step.

Three trainers of the averaging service (`node.collective`) on loopback: g0 and g1 name each other
as the run's trainers (`admitted_trainers`), g2 is an outsider that admits anyone and declares
every round they declare. The named trainers skip its signed round declarations (so its step
counts for nobody but itself), refuse its contributions, and average with each other only; the
outsider, refused by both, averages alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hivemind.p2p import PeerID

from node.collective.averager import GatherAverager
from node.collective.codecs import codec_for
from node.collective.round_types import RoundOutcome
from node.swarm import wait_until
from protocol.dht_keys import signed_subkey
from tests.helpers.gather import gather_swarm

SHAPES = [torch.Size([64]), torch.Size([32])]
HASH = "00" * 8


@pytest.fixture(scope="module")
def swarm(one_torch_thread: None) -> Iterator[list[GatherAverager]]:
    # the outsider's gather waits for the named trainers until its deadline: keep that short
    with gather_swarm(3, shapes=SHAPES, admit=[0, 1], gather_timeout_s=8.0) as averagers:
        yield averagers


def _id(averager: GatherAverager) -> bytes:
    return averager.rounds.me


def _holds_declaration_of(reader: GatherAverager, writer: GatherAverager) -> bool:
    """Whether `reader`'s DHT node finds `writer`'s signed round declaration (whoever it admits)."""
    dht = reader.rounds.dht
    assert dht is not None
    found = dht.get(reader.rounds.round_key, latest=True)
    subkey = signed_subkey(PeerID(_id(writer)).to_base58())
    return found is not None and isinstance(found.value, dict) and subkey in found.value


def _declare_and_wait(swarm: list[GatherAverager], steps: list[int]) -> None:
    """Each trainer declares its step; returns once every one sees what it admits and the named
    trainers' DHT nodes hold the outsider's declaration too."""
    named, other, outsider = swarm
    for averager, step in zip(swarm, steps, strict=True):
        averager.prepare_round(step, 0.5, HASH)
    assert wait_until(
        lambda: (
            named.peer_steps().get(_id(other)) == steps[1]
            and other.peer_steps().get(_id(named)) == steps[0]
            and outsider.peer_steps() == {_id(named): steps[0], _id(other): steps[1]}
            and _holds_declaration_of(named, outsider)
            and _holds_declaration_of(other, outsider)
        ),
        timeout_s=60,
    )


def test_an_outsiders_step_declaration_counts_only_for_itself(swarm: list[GatherAverager]) -> None:
    named, other, outsider = swarm
    # "the run is far ahead": counted, it would make the named trainers give their rounds up
    _declare_and_wait(swarm, [0, 0, 1_000])
    assert named.peer_steps() == {_id(other): 0}
    assert other.peer_steps() == {_id(named): 0}
    assert outsider.peer_steps() == {_id(named): 0, _id(other): 0}


def test_the_named_trainers_average_with_each_other_only(swarm: list[GatherAverager]) -> None:
    named, other, outsider = swarm
    step = 1
    gen = torch.Generator().manual_seed(7)
    grads = [[torch.randn(shape, generator=gen) for shape in SHAPES] for _ in swarm]
    _declare_and_wait(swarm, [step] * 3)
    pending = [a.start_average(g, step=step, outer_hash=HASH) for a, g in zip(swarm, grads, strict=True)]
    outcomes: list[RoundOutcome] = [p.result() for p in pending]
    mine, theirs, alone = outcomes
    assert (mine.num_peers, theirs.num_peers) == (2, 2), outcomes
    assert mine.in_sync and theirs.in_sync
    assert mine.round_id and mine.round_id == theirs.round_id
    assert alone.num_peers == 1 and alone.averaged is None and alone.round_id != mine.round_id
    assert mine.averaged is not None and theirs.averaged is not None
    codec = codec_for("int8", SHAPES)  # the swarm's codec: stateless, so it decodes what they sent
    sent = [codec.decode(codec.encode(g)) for g in grads[:2]]
    for x, y, a, b in zip(mine.averaged, theirs.averaged, *sent, strict=True):
        assert torch.equal(x, y)
        # two inputs: CenteredClip clips neither, so the result is their mean
        torch.testing.assert_close(x, (a + b) / 2)
    assert set(mine.received_bytes) == {_id(other)}
    assert set(theirs.received_bytes) == {_id(named)}
    # averaging in sync gives standing (whose steps and states count later): the outsider has none
    assert _id(outsider) not in named.rounds.standing | other.rounds.standing
