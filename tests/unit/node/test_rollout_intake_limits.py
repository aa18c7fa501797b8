"""The submit intake's limits, driven through `handle_stream` with in-memory streams (no libp2p):
the total stream cap, a shared ban list, a handler that answers wrongly or fails, and the
forward intake's trust check before reading."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import PeerID

from node.bans import BanList
from node.broadcast.wire import encode_frame
from node.identity import Identity
from node.rollouts import ForwardConfig, ForwardIntake, IntakeConfig, RolloutIntake
from protocol import rollout_forward_pb2 as fpb
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope
from protocol.rollout_messages import seal_group
from tests.helpers.rollouts import RUN, RecordingWriter, key, make_group, peer_bytes, verdicts_for
from tests.helpers.waiting import async_wait_until

VALIDATOR = key("limits validator")
WORKERS = [key(f"limits worker {i}") for i in range(3)]


def _identity(private_key: Any) -> Identity:
    return Identity(private_key=private_key, path=Path("/nonexistent/key"))


def _intake(handler: Any, **config: Any) -> RolloutIntake:
    return RolloutIntake(
        dht=None, identity=_identity(VALIDATOR), run_id=RUN, handler=handler, config=IntakeConfig(**config)
    )


async def _accept(worker: bytes, envelope: Envelope, group: rpb.RolloutGroup) -> list[bytes]:
    return verdicts_for(VALIDATOR, worker, group)


async def _serve(intake: Any, private_key: Any, data: bytes, *, eof: bool = True) -> RecordingWriter:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    writer = RecordingWriter()
    await intake.handle_stream(PeerID(peer_bytes(private_key)), reader, writer)
    return writer


def _frame(private_key: Any, num_rollouts: int = 2) -> bytes:
    return encode_frame(seal_group(private_key, run_id=RUN, group=make_group(num_rollouts), seq=1))


def test_total_stream_cap_refuses_other_peers_while_full() -> None:
    async def main() -> None:
        intake = _intake(_accept, max_streams=1, frame_timeout_s=30)
        idle_reader = asyncio.StreamReader()  # a peer that opens a stream and stays silent
        idle = asyncio.ensure_future(
            intake.handle_stream(PeerID(peer_bytes(WORKERS[0])), idle_reader, RecordingWriter())  # type: ignore[arg-type]
        )
        await async_wait_until(lambda: intake.open_streams == 1, timeout_s=10)
        busy = await _serve(intake, WORKERS[1], _frame(WORKERS[1]))
        (response,) = busy.responses()
        assert "busy: too many streams" in rpb.SubmitResponse.FromString(response).error
        idle_reader.feed_eof()
        await idle
        served = await _serve(intake, WORKERS[1], _frame(WORKERS[1]))
        (response,) = served.responses()
        assert len(rpb.SubmitResponse.FromString(response).verdicts) == 2

    asyncio.run(main())


def test_a_shared_ban_list_refuses_peers_the_validator_banned() -> None:
    async def main() -> None:
        bans = BanList(60.0, 3600.0)
        intake = RolloutIntake(
            dht=None, identity=_identity(VALIDATOR), run_id=RUN, handler=_accept, bans=bans
        )
        bans.ban(peer_bytes(WORKERS[2]), "cheated: toploc")  # e.g. by the validator logic
        (response,) = (await _serve(intake, WORKERS[2], _frame(WORKERS[2]))).responses()
        assert "banned" in rpb.SubmitResponse.FromString(response).error
        assert intake.groups_received == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (lambda worker, group: [], "invalid answer"),
        (lambda worker, group: [b"x" * 9000] * len(group.rollouts), "invalid answer"),
        (lambda worker, group: 1 / 0, "failed to judge the group: ZeroDivisionError"),
    ],
)
def test_a_handler_that_answers_wrongly_or_fails_is_reported_without_a_ban(answer: Any, match: str) -> None:
    async def handler(worker: bytes, envelope: Envelope, group: rpb.RolloutGroup) -> list[bytes]:
        return answer(worker, group)  # type: ignore[no-any-return]

    async def main() -> None:
        intake = _intake(handler)
        (response,) = (await _serve(intake, WORKERS[0], _frame(WORKERS[0]))).responses()
        assert match in rpb.SubmitResponse.FromString(response).error
        assert not intake.bans.is_banned(PeerID(peer_bytes(WORKERS[0])))

    asyncio.run(main())


def test_several_groups_on_one_stream_each_get_an_answer_then_a_bad_one_bans() -> None:
    async def main() -> None:
        intake = _intake(_accept)
        writer = await _serve(
            intake, WORKERS[0], _frame(WORKERS[0]) + _frame(WORKERS[0], 3) + encode_frame(b"\xff" * 10)
        )
        first, second, third = (rpb.SubmitResponse.FromString(r) for r in writer.responses())
        assert len(first.verdicts) == 2 and len(second.verdicts) == 3
        assert "malformed" in third.error and "banned" in third.error
        assert intake.bans.is_banned(PeerID(peer_bytes(WORKERS[0])))

    asyncio.run(main())


def test_forward_intake_answers_untrusted_peers_before_reading() -> None:
    async def main() -> None:
        async def handler(validator: bytes, forwarded: Any) -> None:
            raise AssertionError("an untrusted forward reached the handler")

        intake = ForwardIntake(
            dht=None,
            identity=_identity(key("trainer")),
            run_id=RUN,
            handler=handler,
            config=ForwardConfig(trusted_validators=[PeerID(peer_bytes(VALIDATOR)).to_base58()]),
        )
        reader = asyncio.StreamReader()
        reader.feed_data(b"\x7f\xff\xff\xff" + b"garbage")  # never parsed: no ban
        reader.feed_eof()
        writer = RecordingWriter(reader)
        await intake.handle_stream(PeerID(peer_bytes(WORKERS[1])), reader, writer)  # type: ignore[arg-type]
        (response,) = writer.responses()
        assert "trusted validators" in fpb.ForwardResponse.FromString(response).error
        assert writer.unread_at_first_write == 11  # answered before reading a byte
        assert not intake.bans.is_banned(PeerID(peer_bytes(WORKERS[1])))

    asyncio.run(main())
