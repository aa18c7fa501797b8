"""A reducer that sends one member a different average than the others is caught by the next round's hash check.

Four averagers on loopback; peer3's reducer adds 0.5 to every value of the average it returns
to one member (the "victim": the member with the lowest PeerID other than its own, the same in
both passes of an audited round) and sends the true average to everyone else. The victim's
outer state then differs from the group's: without the reducer audit it holds the shifted
average, with it the two parts the liar reduced (one per pass) are disputed on the victim alone
and left out. Either way, in the next round each member's `outer_hash` (gathered at
matchmaking) shows it: the victim is told it is out of sync (it then downloads the majority's
state), the others are not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import torch
from hivemind.compression import CompressionInfo
from hivemind.proto import averaging_pb2

from node.averaging.averager import DiLoCoAverager
from node.averaging.codecs import codec_for, decode_tensor
from node.averaging.outer_state import state_hash
from node.averaging.rounds import RoundOutcome
from node.averaging.runner import RobustAllReduceRunner
from tests.helpers.trainers import averager_swarm, round_test_settings, run_round

SHAPES = [torch.Size([250])] * 4  # one part per tensor: each of the four members reduces one


class LyingReducerRunner(RobustAllReduceRunner):
    """Returns the victim a shifted average of the parts it reduces; everyone else gets the true one."""

    async def _accumulate_parts_streaming(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], sender_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        victim = min(p for p in self.ordered_peer_ids if p != self.peer_id)
        lie = self.sender_peer_ids[sender_index] == victim
        codec = codec_for("fp32")
        async for message in super()._accumulate_parts_streaming(stream, sender_index):
            if lie and message.code == averaging_pb2.AVERAGED_PART:
                part = decode_tensor(message.tensor_part) + 0.5
                message = averaging_pb2.AveragingData(
                    code=message.code, tensor_part=codec.compress(part, CompressionInfo.from_tensor(part))
                )
            yield message


class LyingReducerAverager(DiLoCoAverager):
    runner_class = LyingReducerRunner


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "audited"])
def swarm(request: pytest.FixtureRequest) -> Iterator[list[DiLoCoAverager]]:
    torch.set_num_threads(1)
    kwargs = round_test_settings(f"lyingreducer-{request.param}", 4, audit_reducers=request.param)
    classes = [DiLoCoAverager, DiLoCoAverager, DiLoCoAverager, LyingReducerAverager]
    with averager_swarm(SHAPES, classes, **kwargs) as averagers:
        yield averagers


def _round(averagers: list[DiLoCoAverager], step: int, hashes: list[str]) -> list[RoundOutcome]:
    gen = torch.Generator().manual_seed(step)
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in averagers]
    return run_round(averagers, grads, step=step, hashes=hashes)


def test_a_reducer_that_equivocates_leaves_its_victim_out_of_sync(swarm: list[DiLoCoAverager]) -> None:
    for step in range(0, 6, 2):
        first = _round(swarm, step, ["start"] * 4)
        # A member a reducer left out (e.g. its request beat the reducer's group setup on a loaded
        # machine) holds zeros in that slice and reports the round incomplete: run another one.
        if all(o.in_sync for o in first):
            break
    assert all(o.in_sync for o in first), "no complete round in three tries"
    results = [o.averaged for o in first]
    assert all(r is not None for r in results) and all(o.num_peers == 4 for o in first)
    hashes = [state_hash(r) for r in results if r is not None]
    odd = [i for i, h in enumerate(hashes) if hashes.count(h) == 1]
    assert len(odd) == 1 and len(set(hashes)) == 2, "exactly one member (the victim) got the shifted average"
    victim = odd[0]
    audited = swarm[0].audit_reducers
    assert [o.disputed_parts for o in first] == [2 if audited and i == victim else 0 for i in range(4)]
    second = _round(swarm, step + 1, hashes)
    assert all(o.num_peers == 4 for o in second)
    assert [o.in_sync for o in second] == [i != victim for i in range(4)]
