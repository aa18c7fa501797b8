"""What a joiner concludes from a seed's dial-back answer, with the seed's stream stood in (no network)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hivemind.p2p import PeerID

from node.broadcast.wire import encode_frame
from node.reachability import request_dial_back
from protocol import hivenet_pb2 as pb
from tests.helpers.rollouts import RecordingWriter, key, peer_bytes

SEED = PeerID(peer_bytes(key("dial-back request seed")))
SEED_ADDRESS = f"/ip4/127.0.0.1/tcp/4001/p2p/{SEED.to_base58()}"


class SeedStream:
    """The P2P of a joiner whose seed answers each dial-back stream with `answer` (None: closes it)."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.peer_id = PeerID(peer_bytes(key("dial-back request joiner")))

    async def call_binary_stream_handler(self, peer_id: PeerID, name: str) -> tuple[None, Any, Any]:
        reader = asyncio.StreamReader()
        if self.answer is not None:
            reader.feed_data(encode_frame(self.answer))
        reader.feed_eof()
        return None, reader, RecordingWriter(reader)


def _ask(answer: bytes | None) -> Any:
    node = SimpleNamespace(p2p=SeedStream(answer))
    return asyncio.run(request_dial_back(None, node, [SEED_ADDRESS], ["/ip4/127.0.0.1/tcp/5000"]))  # type: ignore[arg-type]


def test_a_seed_that_closes_the_stream_without_an_answer_says_nothing_about_reachability() -> None:
    # Seen in CI: the joiner printed "not reachable from outside: ...: DIAL_BACK_UNSPECIFIED" and
    # published itself as private, though the seed had tried nothing.
    outcome = _ask(None)
    assert not outcome.answered and not outcome.reachable
    assert "closed the stream without an answer" in outcome.detail and "UNSPECIFIED" not in outcome.detail


def test_a_seed_that_could_not_reach_the_joiner_says_so() -> None:
    answer = pb.DialBackResponse(
        code=pb.DIAL_BACK_UNREACHABLE, detail="connection refused"
    ).SerializeToString()
    outcome = _ask(answer)
    assert outcome.answered and not outcome.reachable
    assert "DIAL_BACK_UNREACHABLE connection refused" in outcome.detail
