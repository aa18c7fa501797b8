"""A run that names its trainers averages only with them: an outsider cannot join their group or move their step.

Three averagers on loopback: peer0 and peer1 name each other as the run's trainers
(`admitted_trainers`), peer2 is an outsider that admits anyone and tries to average with them
in every round. The named trainers ignore its signed matchmaking declarations and step
advertisements, refuse its join requests, and average with each other only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from node.averaging.averager import DiLoCoAverager
from tests.helpers.trainers import averager_swarm, round_test_settings, run_round

SHAPES = [torch.Size([64]), torch.Size([32])]


@pytest.fixture(scope="module")
def swarm() -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings("admission", 3)
    with averager_swarm(SHAPES, [DiLoCoAverager] * 3, admit=[0, 1], **kwargs) as averagers:
        yield averagers


def test_an_outsiders_step_advertisement_counts_only_for_itself(swarm: list[DiLoCoAverager]) -> None:
    named, other, outsider = swarm
    outsider.publish_step(1_000)  # "the run is far ahead": it would make named trainers give up rounds
    assert set(named.peer_steps()) == {other.peer_id.to_bytes()}
    assert set(other.peer_steps()) == {named.peer_id.to_bytes()}
    assert set(outsider.peer_steps()) == {named.peer_id.to_bytes(), other.peer_id.to_bytes()}
    outsider.publish_step(0)


def test_the_named_trainers_average_with_each_other_only(swarm: list[DiLoCoAverager]) -> None:
    gen = torch.Generator().manual_seed(7)
    grads = [[torch.randn(shape, generator=gen) for shape in SHAPES] for _ in swarm]
    for step in range(0, 6, 2):  # a round a loaded machine leaves incomplete is run again
        outcomes = run_round(swarm, grads, step=step)
        if all(o.averaged is not None and o.in_sync for o in outcomes[:2]):
            break
    named, other, outsider = outcomes
    assert (named.num_peers, other.num_peers) == (2, 2), outcomes
    assert outsider.num_peers == 1 and outsider.round_id != named.round_id
    assert named.averaged is not None and other.averaged is not None
    for mine, theirs, a, b in zip(named.averaged, other.averaged, grads[0], grads[1], strict=True):
        assert torch.equal(mine, theirs)
        # two inputs: CenteredClip clips neither, so the result is their mean (fp32 parts)
        torch.testing.assert_close(mine, (a + b) / 2)
    assert swarm[1].peer_id.to_bytes() in named.received_bytes
    assert swarm[2].peer_id.to_bytes() not in named.received_bytes
