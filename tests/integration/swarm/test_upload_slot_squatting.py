"""A few identities holding every upload stream of a publisher do not keep an honest peer from fetching
(issue 12, 'upload-slot exhaustion').

On 127.0.0.1 (`tests.helpers.upload_slots`, which `bench/robustness.py` runs too): a publisher
whose manifest and chunk streams are capped at 4 in total and 2 per peer, and two attackers
(plain hivemind P2P daemons, fresh identities) that open 2 chunk streams each and never send a
request, holding all 4 slots for as long as the publisher lets a silent stream live (two
minutes). With caps alone the honest fetch was refused as busy until then and failed
(`WeightsUnavailable`: no peer served the manifest); with fair-share admission
(`node.stream_slots`) its streams preempt the attackers' and the fetch completes, while each
attacker stream that lost its slot is told it was preempted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.broadcast import Swarm, open_swarm
from tests.helpers.upload_slots import squat_upload_slots


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"), num_nodes=2)


def test_silent_streams_of_a_few_identities_do_not_block_an_honest_fetch(
    swarm: Swarm, tmp_path: Path
) -> None:
    publisher, honest = swarm.nodes
    outcome = asyncio.run(squat_upload_slots(publisher, honest, tmp_path))
    assert outcome.fetched, outcome.error
    assert outcome.preemptions >= 1
    assert outcome.told_preempted == outcome.preemptions
