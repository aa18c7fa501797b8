"""`StateService` end to end: real services on both sides of real asyncio streams (socket pairs), wired
by `LoopbackP2P`, a stand-in for hivemind's public P2P stream API (the unit tier starts no p2pd).

Downloads: two agreeing sources, a trusted single source, an unconfirmed single source, sources that
lie (banned, the payload of a wrong-size header never read), one that dies mid-payload (skipped, not
banned) and witnesses the caller does not count. Serving: the per-peer request and download budgets
("busy", never a ban), the total and per-peer download stream caps, bans for oversized or malformed
requests, a silent stream timed out, `set_state(None)` and one serialization per state.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import torch
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from node.bans import BanList
from node.broadcast.wire import encode_frame, read_frame
from node.collective import state_wire as wire
from node.collective.outer_state import OuterState
from node.collective.state_service import StateService, StateServiceConfig
from tests.helpers.rollouts import key, peer_bytes
from tests.helpers.waiting import async_wait_until

PROTO = "/hivenet/test/state/1"
SHAPES = [(16, 8), (8,)]
BIG_SHAPES = [(300, 256)]  # 614 KB: more than the upload limiter's 256 KB burst
HEADER_FRAME = 4 + 29
Handler = Callable[[Any, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class LoopbackP2P:
    """The stream API of `hivemind.P2P` over socket pairs: each call runs the target's handler."""

    def __init__(self, net: dict[PeerID, LoopbackP2P], name: str) -> None:
        self.net, self.peer_id = net, PeerID(peer_bytes(key(f"state service {name}")))
        self.handlers: dict[str, Handler] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        net[self.peer_id] = self

    async def add_binary_stream_handler(self, name: str, handler: Handler, balanced: bool = False) -> None:
        self.handlers[name] = handler

    async def remove_binary_stream_handler(self, name: str) -> None:
        del self.handlers[name]

    async def call_binary_stream_handler(
        self, peer_id: PeerID, name: str
    ) -> tuple[StreamInfo, asyncio.StreamReader, asyncio.StreamWriter]:
        target = self.net.get(peer_id)
        if target is None or name not in target.handlers:
            raise ConnectionRefusedError(f"{peer_id} does not serve {name}")
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        their_reader, their_writer = await asyncio.open_connection(sock=theirs)
        info = StreamInfo(self.peer_id, None, name)  # type: ignore[arg-type]
        task = asyncio.ensure_future(target.handlers[name](info, their_reader, their_writer))
        target.tasks.add(task)
        task.add_done_callback(target.tasks.discard)
        return StreamInfo(peer_id, None, name), reader, writer  # type: ignore[arg-type]


def make_state(step: int = 5, seed: int = 0, shapes: Sequence[Sequence[int]] = SHAPES) -> OuterState:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(*shape, generator=generator) for shape in shapes]
    return OuterState(params, [torch.randn(*shape, generator=generator) for shape in shapes], step)


def same(a: OuterState | None, b: OuterState) -> bool:
    return (
        a is not None
        and a.step == b.step
        and all(torch.equal(x, y) for x, y in zip(a.params + a.momentum, b.params + b.momentum, strict=True))
    )


def service(
    node: LoopbackP2P, shapes: Sequence[Sequence[int]] = SHAPES, clock: Any = None, **config: Any
) -> StateService:
    extra = {} if clock is None else {"clock": clock}
    return StateService(
        node,  # type: ignore[arg-type]
        proto=PROTO,
        shapes=shapes,
        config=StateServiceConfig(**config),
        bans=BanList(60.0, 3600.0, owner=f"state {node.peer_id.to_base58()[-4:]}"),
        label="test",
        **extra,
    )


async def serving(node: LoopbackP2P, state: OuterState | None, **config: Any) -> StateService:
    server = service(node, **config)
    server.set_state(state)
    await server.start()
    return server


def raw_source(node: LoopbackP2P, answer: bytes) -> None:
    """A source that reads a request and sends `answer` verbatim, then closes."""

    async def handler(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):  # the client may hang up without reading it all
            await read_frame(reader, wire.MAX_REQUEST_BYTES)
            writer.write(answer)
            await writer.drain()
        writer.close()

    node.handlers[PROTO] = handler


def run(main: Callable[[dict[PeerID, LoopbackP2P]], Awaitable[None]]) -> None:
    async def wrapper() -> None:
        net: dict[PeerID, LoopbackP2P] = {}
        try:
            await main(net)
        finally:
            tasks = [t for node in net.values() for t in node.tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(wrapper())


def test_two_agreeing_sources_give_the_state_and_the_second_only_offers() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state()
        s1, s2, me = LoopbackP2P(net, "s1"), LoopbackP2P(net, "s2"), LoopbackP2P(net, "me")
        first, second = await serving(s1, state), await serving(s2, state)
        client = service(me)
        result = await client.fetch([me.peer_id, s1.peer_id, s2.peer_id], newer_than=4, timeout_s=10)
        assert result.verdict == "agreed" and result.source == s1.peer_id
        assert same(result.state, state)
        payload = wire.payload_bytes(SHAPES)
        assert (first.bytes_sent, second.bytes_sent) == (HEADER_FRAME + payload, HEADER_FRAME)
        assert client.bytes_received == 2 * HEADER_FRAME + payload
        stale = await client.fetch([s1.peer_id, s2.peer_id], newer_than=5, timeout_s=10)
        assert stale.verdict == "none" and first.refusals["stale"] == 1
        assert not client.bans.is_banned(s1.peer_id)

    run(main)


def test_a_trusted_single_source_is_taken_and_an_untrusted_one_stays_unconfirmed() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state(step=3)
        source, me = LoopbackP2P(net, "publisher"), LoopbackP2P(net, "me")
        await serving(source, state)
        client = service(me)
        trusted = frozenset({source.peer_id.to_bytes()})
        taken = await client.fetch([source.peer_id], newer_than=0, trusted=trusted, timeout_s=10)
        assert taken.verdict == "agreed" and taken.source == source.peer_id and same(taken.state, state)
        alone = await client.fetch([source.peer_id], newer_than=0, timeout_s=10)
        assert alone.verdict == "unconfirmed" and alone.state is None
        assert [(o.source, o.step, o.hash) for o in alone.offers] == [(source.peer_id, 3, state.hash())]

    run(main)


def _lie(kind: str, state: OuterState) -> bytes:
    """What a lying source answers a download with."""
    size = wire.payload_bytes(SHAPES)
    served = wire.serialize_state(state, SHAPES)
    if kind == "hash mismatch":  # the header of one state, the payload of another
        other = wire.serialize_state(make_state(seed=9), SHAPES)
        return encode_frame(wire.encode_header(5, served.hash, size)) + bytes(other.payload)
    if kind == "non-finite":
        poisoned = make_state()
        poisoned.params[0][0, 0] = float("nan")
        bad = wire.serialize_state(poisoned, SHAPES)
        return encode_frame(wire.encode_header(5, bad.hash, size)) + bytes(bad.payload)
    if kind == "stale step":
        return encode_frame(wire.encode_header(4, served.hash, size)) + bytes(served.payload)
    assert kind == "wrong size"
    return encode_frame(wire.encode_header(5, served.hash, size + 4)) + bytes(served.payload) + b"\0" * 4


@pytest.mark.parametrize("kind", ["hash mismatch", "non-finite", "stale step", "wrong size"])
def test_a_lying_source_is_banned_and_the_next_candidates_are_tried(kind: str) -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state()
        liar, s1, s2, me = (LoopbackP2P(net, name) for name in ("liar", "s1", "s2", "me"))
        raw_source(liar, _lie(kind, state))
        await serving(s1, state)
        await serving(s2, state)
        client = service(me)
        result = await client.fetch([liar.peer_id, s1.peer_id, s2.peer_id], newer_than=4, timeout_s=10)
        assert client.bans.is_banned(liar.peer_id)
        assert result.verdict == "agreed" and result.source == s1.peer_id and same(result.state, state)
        received = client.bytes_received
        again = await client.fetch([liar.peer_id], newer_than=4, timeout_s=10)  # banned: not even asked
        assert again.verdict == "none" and client.bytes_received == received
        if kind == "wrong size":  # refused on its header: not a byte of its payload was read
            assert (
                client.bytes_received
                == HEADER_FRAME + (HEADER_FRAME + wire.payload_bytes(SHAPES)) + HEADER_FRAME
            )

    run(main)


def test_a_source_that_closes_mid_payload_is_skipped_without_a_ban() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state()
        quitter, s1, s2, me = (LoopbackP2P(net, name) for name in ("quitter", "s1", "s2", "me"))
        served = wire.serialize_state(state, SHAPES)
        half = bytes(served.payload)[: len(served.payload) // 2]
        raw_source(quitter, encode_frame(wire.encode_header(5, served.hash, len(served.payload))) + half)
        await serving(s1, state)
        await serving(s2, state)
        client = service(me)
        result = await client.fetch([quitter.peer_id, s1.peer_id, s2.peer_id], newer_than=4, timeout_s=10)
        assert result.verdict == "agreed" and result.source == s1.peer_id and same(result.state, state)
        assert not client.bans.is_banned(quitter.peer_id)
        alone = await client.fetch([quitter.peer_id], newer_than=4, timeout_s=10)
        assert alone.verdict == "none"

    run(main)


@pytest.mark.parametrize("excluded", [("s2",), ("s1",), ("s1", "s2")])
def test_only_peers_that_count_as_witnesses_confirm_a_state(excluded: tuple[str, ...]) -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state()
        nodes = {name: LoopbackP2P(net, name) for name in ("s1", "s2", "me")}
        for name in ("s1", "s2"):
            await serving(nodes[name], state)
        client = service(nodes["me"])
        outsiders = {nodes[name].peer_id.to_bytes() for name in excluded}
        result = await client.fetch(
            [nodes["s1"].peer_id, nodes["s2"].peer_id],
            newer_than=4,
            counts_as_witness=lambda peer: peer not in outsiders,
            timeout_s=10,
        )
        assert result.verdict == "unconfirmed" and result.state is None
        assert [(o.source, o.step, o.hash) for o in result.offers] == [(nodes["s1"].peer_id, 5, state.hash())]

    run(main)


def test_a_peer_over_its_budget_is_told_busy_and_not_banned_while_another_is_served() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state()
        source, greedy, other = (LoopbackP2P(net, name) for name in ("source", "greedy", "other"))
        server = await serving(
            source, state, downloads_per_peer_per_window=2, offers_per_peer_per_window=5, clock=lambda: 0.0
        )
        client, bystander = service(greedy), service(other)
        for _ in range(2):
            header, payload = await client.query(source.peer_id, download=True, newer_than=4, timeout_s=10)
            assert not header.error and payload is not None
        header, payload = await client.query(source.peer_id, download=True, newer_than=4, timeout_s=10)
        assert header.error == "busy: state upload budget spent; try again in 30 s" and payload is None
        header, _ = await client.query(source.peer_id, download=False, newer_than=4, timeout_s=10)
        assert (header.step, header.hash, header.error) == (5, state.hash(), "")  # offers: their own budget
        trusted = frozenset({source.peer_id.to_bytes()})
        refused = await client.fetch([source.peer_id], newer_than=4, trusted=trusted, timeout_s=10)
        assert refused.verdict == "none" and not client.bans.is_banned(source.peer_id)
        header, _ = await client.query(source.peer_id, download=False, newer_than=4, timeout_s=10)
        assert header.error == "busy: state request budget spent; try again in 12 s"
        served = await bystander.fetch([source.peer_id], newer_than=4, trusted=trusted, timeout_s=10)
        assert served.verdict == "agreed" and same(served.state, state)
        assert server.refusals == {"download_budget": 2, "request_budget": 1}
        assert not server.bans.is_banned(greedy.peer_id)

    run(main)


def test_download_streams_are_capped_per_peer_and_in_total() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        state = make_state(shapes=BIG_SHAPES)
        source = LoopbackP2P(net, "source")
        server = service(source, BIG_SHAPES, max_streams=2, max_streams_per_peer=1, upload_bytes_per_s=1.0)
        server.set_state(state)
        await server.start()
        a, b, c = (service(LoopbackP2P(net, name), BIG_SHAPES) for name in ("a", "b", "c"))

        def download(client: StateService) -> Awaitable[tuple[wire.Header, bytearray | None]]:
            return client.query(source.peer_id, download=True, newer_than=4, timeout_s=60)

        held_a = asyncio.ensure_future(download(a))  # throttled past the limiter's burst: held open
        await async_wait_until(lambda: server.slots.total == 1 and server.bytes_sent > 0, timeout_s=10)
        header, _ = await download(a)
        assert header.error == "busy: at most 1 streams per peer"
        held_b = asyncio.ensure_future(download(b))
        await async_wait_until(lambda: server.slots.total == 2, timeout_s=10)
        header, _ = await download(c)
        assert header.error == "busy: too many streams, try again later"
        assert server.refusals == {"streams": 2} and not held_a.done() and not held_b.done()
        server.limiter.bytes_per_s = None  # the cap lifted: both held uploads finish
        for done in await asyncio.gather(held_a, held_b):
            header, payload = done
            assert payload is not None and same(wire.decode_state(payload, BIG_SHAPES, 5, header.hash), state)
        for _ in range(3):  # c's refused download did not spend its budget of three
            header, payload = await download(c)
            assert not header.error and payload is not None
        await async_wait_until(lambda: server.slots.total == 0, timeout_s=10)
        assert not server.bans.is_banned(a.p2p.peer_id) and server.refusals == {"streams": 2}

    run(main)


@pytest.mark.parametrize(
    ("request_bytes", "match"),
    [
        ((10_000).to_bytes(4, "big") + b"\0" * 300, "exceeds the 256-byte limit"),
        (encode_frame(b"XXXX" + wire.encode_request(wire.DOWNLOAD, 0)[4:]), "malformed state request"),
        (encode_frame(wire.encode_request(wire.OFFER, 0) + b"\0"), "state request of 14 bytes"),
    ],
)
def test_an_oversized_or_malformed_request_bans_its_sender(request_bytes: bytes, match: str) -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        source, sender = LoopbackP2P(net, "source"), LoopbackP2P(net, "sender")
        server = await serving(source, make_state())
        _, reader, writer = await sender.call_binary_stream_handler(source.peer_id, PROTO)
        writer.write(request_bytes)
        frame = await read_frame(reader, wire.MAX_HEADER_BYTES)
        writer.close()
        assert frame is not None
        error = wire.parse_header(frame).error
        assert match in error and "banned" in error and server.bans.is_banned(sender.peer_id)
        header, _ = await service(sender).query(source.peer_id, download=False, newer_than=0, timeout_s=10)
        assert header.error.startswith("refused: this peer is banned")
        assert server.refusals == {"malformed": 1, "banned": 1}
        # the two refusals are all it sent, and they count (bytes per token counts every byte)
        assert server.bytes_sent == len(frame) + 4 + len(wire.encode_error(header.error)) + 4

    run(main)


def test_a_stream_without_a_request_is_timed_out_without_a_ban() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        source, silent = LoopbackP2P(net, "source"), LoopbackP2P(net, "silent")
        server = await serving(source, make_state(), frame_timeout_s=0.2)
        _, reader, writer = await silent.call_binary_stream_handler(source.peer_id, PROTO)
        frame = await asyncio.wait_for(read_frame(reader, wire.MAX_HEADER_BYTES), timeout=10)
        writer.close()
        assert frame is not None and wire.parse_header(frame).error == "timed out: no request within 0.2 s"
        assert server.refusals == {"timeout": 1} and not server.bans.is_banned(silent.peer_id)

    run(main)


def test_set_state_none_serves_nothing_and_each_state_is_serialized_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = wire.serialize_state

    def counting(state: OuterState, shapes: Sequence[Sequence[int]]) -> wire.SerializedState:
        calls.append(state.step)
        return real(state, shapes)

    monkeypatch.setattr(wire, "serialize_state", counting)

    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        source, me = LoopbackP2P(net, "source"), LoopbackP2P(net, "me")
        server = await serving(source, make_state(step=5))
        client = service(me)
        flood = [service(LoopbackP2P(net, f"peer {i}")) for i in range(4)]
        queries = [
            c.query(source.peer_id, download=i < 2, newer_than=0, timeout_s=10) for i, c in enumerate(flood)
        ]
        assert {h.step for h, _ in await asyncio.gather(*queries)} == {5}  # two downloads, two offers at once
        server.set_state(None)
        header, payload = await client.query(source.peer_id, download=True, newer_than=0, timeout_s=10)
        assert header.error == "no state: this trainer serves none now" and payload is None
        assert (await client.fetch([source.peer_id], newer_than=0, timeout_s=10)).verdict == "none"
        later = make_state(step=9, seed=3)
        server.set_state(later)
        header, payload = await client.query(source.peer_id, download=True, newer_than=5, timeout_s=10)
        assert (header.step, header.hash) == (9, later.hash()) and payload is not None
        assert calls == [5, 9] and server.refusals == {"no_state": 2}
        await server.stop()
        assert (await client.fetch([source.peer_id], newer_than=0, timeout_s=10)).verdict == "none"

    run(main)


def test_a_poller_asks_each_source_no_faster_than_its_budget_allows_and_is_never_shunned() -> None:
    # Seen in the churn soak: trainers polling for a second witness every half second spent a
    # source's request budget, were told "busy", kept asking, and got silence for the rest of the
    # window, exactly while they needed that source to resync.
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        now = [0.0]
        budget: dict[str, Any] = dict(offers_per_peer_per_window=4, window_s=60.0, clock=lambda: now[0])
        source, me = LoopbackP2P(net, "source"), LoopbackP2P(net, "me")
        server = await serving(source, make_state(), **budget)
        client = service(me, **budget)
        progress = client.new_progress()
        for _ in range(60):  # 30 s of polls, two a second; nobody confirms the single source
            result = await client.fetch([source.peer_id], newer_than=4, timeout_s=10, progress=progress)
            assert result.verdict == "unconfirmed"
            now[0] += 0.5
        assert server.refusals == {}
        assert server.answered == {"download": 1, "offer": 1}  # at 0 s and at 15 s

    run(main)


def test_a_poller_waits_as_long_as_a_busy_source_asks() -> None:
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        now = [0.0]
        asked: list[float] = []
        busy, me = LoopbackP2P(net, "busy"), LoopbackP2P(net, "me")

        async def handler(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            asked.append(now[0])
            await read_frame(reader, wire.MAX_REQUEST_BYTES)
            writer.write(
                encode_frame(wire.encode_error("busy: state request budget spent; try again in 9 s"))
            )
            await writer.drain()
            writer.close()

        busy.handlers[PROTO] = handler
        client = service(me, clock=lambda: now[0])
        progress = client.new_progress()
        for _ in range(40):  # 20 s of polls
            assert (
                await client.fetch([busy.peer_id], newer_than=4, timeout_s=10, progress=progress)
            ).verdict == "none"
            now[0] += 0.5
        assert asked == [0.0, 9.0, 18.0]
        assert not client.bans.is_banned(busy.peer_id)

    run(main)


def test_vouchers_add_up_across_polls_while_the_sources_move_on() -> None:
    # Peers apply an outer step at different moments: one witness of a state is often asked a
    # poll before the other, by which time the first serves the next step.
    async def main(net: dict[PeerID, LoopbackP2P]) -> None:
        now = [0.0]
        at_5, at_6 = make_state(step=5, seed=1), make_state(step=6, seed=2)
        s1, s2, me = LoopbackP2P(net, "s1"), LoopbackP2P(net, "s2"), LoopbackP2P(net, "me")
        first, second = await serving(s1, at_5), await serving(s2, make_state(step=4, seed=0))
        client = service(me, clock=lambda: now[0])
        progress = client.new_progress()
        poll = client.fetch([s1.peer_id, s2.peer_id], newer_than=4, timeout_s=10, progress=progress)
        assert (await poll).verdict == "unconfirmed"  # s1 serves step 5; s2 is still at step 4
        first.set_state(at_6)
        second.set_state(at_5)
        now[0] += client.config.ask_interval_s
        result = await client.fetch([s1.peer_id, s2.peer_id], newer_than=4, timeout_s=10, progress=progress)
        assert result.verdict == "agreed" and same(result.state, at_5) and result.source == s1.peer_id

    run(main)
