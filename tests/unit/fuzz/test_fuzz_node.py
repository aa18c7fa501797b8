"""Fuzzing the node-side readers of network bytes: broadcast stream frames and requests, and the
dial-back request (target choice and the whole stream handler). The averaging service's codecs are
fuzzed in tests/unit/node/collective/test_codecs.py.

Stream readers are fed from an `asyncio.StreamReader` and bounded by `asyncio.wait_for`, so a
reader that waits for bytes that never come fails as a hang; a header declaring a huge length
must be refused after reading the header alone. Each property runs twice (fast and `slow`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from multiaddr import Multiaddr

from node.broadcast.service import parse_request
from node.broadcast.wire import encode_frame, read_frame, read_payload
from node.reachability import MAX_DIAL_BACK_REQUEST_BYTES, DialBackService, dial_targets
from protocol import broadcast_pb2 as bpb
from protocol import hivenet_pb2 as pb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_BROADCAST_REQUEST_BYTES
from tests.helpers.fuzzing import arbitrary_or_mutated, fuzz_variants, run_bounded


def _reader(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


# --- broadcast frames and payloads --------------------------------------------------------------

_FRAME = encode_frame(
    bpb.ChunkRequest(run_id="r", version=3, content_id=bytes(32), index=1).SerializeToString()
)


def _read_frame_property(data: bytes, max_bytes: int) -> None:
    async def read_all() -> None:
        reader = _reader(data)
        while True:
            try:
                frame = await read_frame(reader, max_bytes)
            except InvalidMessage:
                return
            if frame is None:
                return
            assert len(frame) <= max_bytes

    run_bounded(read_all())


test_read_frame_fast, test_read_frame_slow = fuzz_variants(
    _read_frame_property,
    st.one_of(st.binary(max_size=512), arbitrary_or_mutated(_FRAME * 3)),
    st.integers(0, MAX_BROADCAST_REQUEST_BYTES),
)


def _huge_header_property(declared: int, body: bytes) -> None:
    async def read_once() -> None:
        reader = _reader(declared.to_bytes(4, "big") + body, eof=False)  # the peer keeps the stream open
        with pytest.raises(InvalidMessage, match="exceeds"):
            await read_frame(reader, MAX_BROADCAST_REQUEST_BYTES)
        assert await reader.readexactly(len(body)) == body  # nothing past the header was consumed

    run_bounded(read_once())


test_read_frame_huge_header_fast, test_read_frame_huge_header_slow = fuzz_variants(
    _huge_header_property,
    st.integers(MAX_BROADCAST_REQUEST_BYTES + 1, (1 << 32) - 1),
    st.binary(max_size=64),
)


def _read_payload_property(data: bytes, declared: int, expected: int) -> None:
    async def read_once() -> None:
        reader = _reader(data, eof=declared == expected)  # a refused size must not wait for any byte
        try:
            payload = await read_payload(reader, declared, expected)
        except InvalidMessage:
            return
        assert declared == expected and len(payload) == expected

    run_bounded(read_once())


test_read_payload_fast, test_read_payload_slow = fuzz_variants(
    _read_payload_property,
    st.binary(max_size=256),
    st.one_of(st.integers(0, 256), st.integers(0, 1 << 64)),
    st.integers(0, 256),
)


def _parse_request_property(data: bytes, message_type: type) -> None:
    try:
        request: object = parse_request(data, message_type)
    except InvalidMessage:
        return
    assert isinstance(request, message_type)


test_parse_request_fast, test_parse_request_slow = fuzz_variants(
    _parse_request_property,
    st.one_of(st.binary(max_size=MAX_BROADCAST_REQUEST_BYTES), arbitrary_or_mutated(_FRAME[4:])),
    st.sampled_from([bpb.ManifestRequest, bpb.ChunkRequest, bpb.WatchRequest]),
)


# --- dial-back ----------------------------------------------------------------------------------

_IPS = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)


@st.composite
def _dial_back_addresses(draw: st.DrawFn, ip: str) -> list[str]:
    kind = "ip6" if ":" in ip else "ip4"
    good = st.integers(0, 70000).map(lambda port: f"/{kind}/{ip}/tcp/{port}")
    multiaddrs = st.sampled_from(["/ip4/1.2.3.4/tcp/1", "/ip6/::1/udp/5", "/dns4/a.b/tcp/2", "/p2p-circuit"])
    return draw(st.lists(st.one_of(good, multiaddrs, st.text(max_size=40)), max_size=10))


@st.composite
def _dial_back_cases(draw: st.DrawFn) -> tuple[list[str], str, bool]:
    ip = draw(_IPS)
    return draw(_dial_back_addresses(ip)), ip, draw(st.booleans())


def _dial_targets_property(case: tuple[list[str], str, bool]) -> None:
    addresses, ip, allow_private = case
    targets = dial_targets(addresses, ip, allow_private=allow_private)
    if isinstance(targets, str):
        return
    assert 0 < len(targets) <= len(addresses)
    for target in targets:
        assert [p.name for p in target.protocols()][1] == "tcp" and ip in str(target)


test_dial_targets_fast, test_dial_targets_slow = fuzz_variants(_dial_targets_property, _dial_back_cases())


@dataclass
class _StreamInfo:
    addr: Multiaddr
    peer_id: str = "QmFuzzPeer"


@dataclass
class _Writer:
    written: bytearray = field(default_factory=bytearray)
    closed: bool = False

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


async def _read_answer(written: bytes) -> bytes | None:
    return await read_frame(_reader(written), 1024)


def _dial_back_stream_property(data: bytes, source: str, allow_private: bool, eof: bool) -> None:
    service = DialBackService(allow_private=allow_private, cooldown_s=0.0)
    dialled: list[object] = []

    async def fake_dial(requester: object, targets: list[Multiaddr]) -> pb.DialBackResponse:
        dialled.append(targets)  # never start a real probe daemon from a fuzz test
        return pb.DialBackResponse(code=pb.DIAL_BACK_REACHABLE)

    service._dial = fake_dial  # type: ignore[method-assign]
    writer = _Writer()

    async def serve() -> None:
        await service.handle_stream(_StreamInfo(Multiaddr(source)), _reader(data, eof=eof), writer)  # type: ignore[arg-type]

    run_bounded(serve())
    assert writer.closed
    frame = run_bounded(_read_answer(bytes(writer.written)))
    assert frame is not None, "the requester always gets one answer"
    response = pb.DialBackResponse.FromString(frame)
    assert response.code != pb.DIAL_BACK_UNSPECIFIED
    assert (response.code == pb.DIAL_BACK_REACHABLE) == bool(dialled)


_SOURCES = st.sampled_from(
    ["/ip4/8.8.8.8/tcp/4001", "/ip4/127.0.0.1/tcp/4001", "/ip6/2606:4700:4700::1111/tcp/4001", "/p2p-circuit"]
)
_DIAL_BACK_REQUEST = encode_frame(
    pb.DialBackRequest(addresses=["/ip4/8.8.8.8/tcp/31337"]).SerializeToString()
)


@st.composite
def _dial_back_streams(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, mutated valid requests, and well-framed requests of fuzzed addresses."""
    framed = _dial_back_addresses("8.8.8.8").map(
        lambda addresses: encode_frame(pb.DialBackRequest(addresses=addresses).SerializeToString())
    )
    return draw(st.one_of(st.binary(max_size=512), arbitrary_or_mutated(_DIAL_BACK_REQUEST), framed))


test_dial_back_stream_fast, test_dial_back_stream_slow = fuzz_variants(
    _dial_back_stream_property,
    _dial_back_streams(),
    _SOURCES,
    st.booleans(),
    st.just(True),
)


def _dial_back_huge_header_property(declared: int, source: str) -> None:
    # the requester declares a huge frame and keeps the stream open: refused without waiting for it
    _dial_back_stream_property(declared.to_bytes(4, "big") + b"\x0a", source, True, False)


test_dial_back_huge_header_fast, test_dial_back_huge_header_slow = fuzz_variants(
    _dial_back_huge_header_property,
    st.integers(MAX_DIAL_BACK_REQUEST_BYTES + 1, (1 << 32) - 1),
    _SOURCES,
)


def test_dial_back_seed_request_is_dialled() -> None:
    service = DialBackService(allow_private=False, cooldown_s=0.0)

    async def fake_dial(requester: object, targets: list[Multiaddr]) -> pb.DialBackResponse:
        assert targets == [Multiaddr("/ip4/8.8.8.8/tcp/31337")]
        return pb.DialBackResponse(code=pb.DIAL_BACK_REACHABLE)

    service._dial = fake_dial  # type: ignore[method-assign]
    writer = _Writer()

    async def serve() -> None:
        reader = _reader(_DIAL_BACK_REQUEST)
        await service.handle_stream(_StreamInfo(Multiaddr("/ip4/8.8.8.8/tcp/4001")), reader, writer)  # type: ignore[arg-type]

    run_bounded(serve())
    frame = run_bounded(_read_answer(bytes(writer.written)))
    assert frame is not None and pb.DialBackResponse.FromString(frame).code == pb.DIAL_BACK_REACHABLE
