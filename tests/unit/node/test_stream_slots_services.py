"""Both users of `StreamSlots`, driven with in-memory streams (no libp2p): the rollout intake preempts a
silent stream of a peer holding the whole budget (and answers it "busy: preempted", no ban), a fetcher
takes the broadcast's "preempted" answer as a busy source (retried later), not as a protocol violation
(banned), the broadcast closes a stream whose peer never takes its response, and a payload write
fails once the peer has taken too long over it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hivemind.p2p import PeerID

from node.bans import BanList
from node.broadcast.config import BroadcastConfig
from node.broadcast.requests import SourceBusy, request_chunk
from node.broadcast.service import PREEMPTED_DETAIL, BroadcastService
from node.broadcast.wire import RateLimiter, encode_frame, write_payload
from node.identity import Identity
from node.rollouts import IntakeConfig, RolloutIntake
from node.rollouts.streams import PREEMPTED_ERROR
from protocol import broadcast_pb2 as bpb
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope
from protocol.manifest import Manifest
from protocol.rollout_messages import seal_group
from tests.helpers.rollouts import RUN, RecordingWriter, key, make_group, peer_bytes, verdicts_for

VALIDATOR = key("slots validator")
SYBIL, HONEST = key("slots sybil"), key("slots honest")


async def _accept(worker: bytes, envelope: Envelope, group: rpb.RolloutGroup) -> list[bytes]:
    return verdicts_for(VALIDATOR, worker, group)


class StalledWriter(RecordingWriter):
    """A writer whose peer never reads: every drain waits forever."""

    async def drain(self) -> None:
        await asyncio.Event().wait()


def test_the_intake_preempts_a_silent_stream_of_the_peer_holding_every_slot() -> None:
    async def main() -> None:
        intake = RolloutIntake(
            dht=None,
            identity=Identity(private_key=VALIDATOR, path=Path("/nonexistent/key")),
            run_id=RUN,
            handler=_accept,
            config=IntakeConfig(
                max_streams=2, max_streams_per_peer=2, frame_timeout_s=30, refusal_linger_s=0
            ),
        )
        sybil = PeerID(peer_bytes(SYBIL))
        silent = [(asyncio.StreamReader(), RecordingWriter()) for _ in range(2)]
        held = [asyncio.ensure_future(intake.handle_stream(sybil, r, w)) for r, w in silent]  # type: ignore[arg-type]
        while intake.open_streams < 2:
            await asyncio.sleep(0)
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame(seal_group(HONEST, run_id=RUN, group=make_group(2), seq=1)))
        reader.feed_eof()
        honest = RecordingWriter()
        await intake.handle_stream(PeerID(peer_bytes(HONEST)), reader, honest)  # type: ignore[arg-type]
        (response,) = honest.responses()
        assert len(rpb.SubmitResponse.FromString(response).verdicts) == 2
        done, pending = await asyncio.wait(held, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and intake.slots.preemptions == 1
        (told,) = [w for (_, w), task in zip(silent, held, strict=True) if task in done]
        (refusal,) = told.responses()
        assert rpb.SubmitResponse.FromString(refusal).error == PREEMPTED_ERROR
        assert told.closed and not intake.bans.is_banned(sybil)
        for r, _ in silent:
            r.feed_eof()
        await asyncio.gather(*pending)
        assert intake.open_streams == 0

    asyncio.run(main())


def test_a_fetcher_takes_a_preempted_chunk_stream_for_a_busy_source() -> None:
    async def main() -> None:
        manifest = Manifest(
            run_id="r",
            version=1,
            publisher=b"",
            created_at=0.0,
            total_bytes=1024,
            chunk_bytes=1024,
            chunk_hashes=b"\x00" * 32,
            tensors=(),
            raw=b"",
            content_id=b"\x00" * 32,
        )
        reader = asyncio.StreamReader()  # a pooled chunk stream the server preempted while it was idle
        header = bpb.ResponseHeader(status=bpb.STATUS_BUSY, detail=PREEMPTED_DETAIL)
        reader.feed_data(encode_frame(header.SerializeToString()))
        reader.feed_eof()
        idle: list[Any] = [(reader, RecordingWriter())]
        try:
            await request_chunk(None, PeerID(peer_bytes(SYBIL)), manifest, 0, idle)  # type: ignore[arg-type]
        except SourceBusy as exc:
            assert "preempted" in str(exc)
        else:
            raise AssertionError("a preempted stream was taken for an answer")

    asyncio.run(main())


def test_the_broadcast_closes_a_stream_whose_peer_never_takes_its_answer(tmp_path: Path) -> None:
    async def main() -> None:
        service = BroadcastService(
            p2p=None,  # type: ignore[arg-type]  # serving a stream needs no daemon
            config=BroadcastConfig(store_dir=tmp_path, write_timeout_s=0.05),
            bans=BanList(60.0, 3600.0),
        )
        serve = service._guarded(service.rpc_manifest)
        reader = asyncio.StreamReader()
        request = bpb.ManifestRequest(run_id="r", version=1, content_id=b"\x00" * 32).SerializeToString()
        reader.feed_data(encode_frame(request))  # then nothing: the stream stays open
        writer = StalledWriter()
        info: Any = type("Info", (), {"peer_id": PeerID(peer_bytes(SYBIL))})()
        await asyncio.wait_for(serve(info, reader, writer), timeout=10)  # type: ignore[arg-type]
        # it returned although the peer neither read the answer nor closed the stream
        assert writer.closed and service.uploads.total == 0

    asyncio.run(main())


def test_a_payload_the_peer_does_not_take_in_its_budget_fails() -> None:
    async def main() -> None:
        writer = StalledWriter()
        payload = write_payload(writer, b"x" * 200_000, RateLimiter(None), drain_budget_s=0.05)  # type: ignore[arg-type]
        task = asyncio.ensure_future(payload)
        done, _ = await asyncio.wait({task}, timeout=10)
        assert task in done, "the write never gave up on a peer that reads nothing"
        assert isinstance(task.exception(), TimeoutError)
        assert len(writer.data) < 200_000  # it stopped at the first slice the peer did not take

    asyncio.run(main())
