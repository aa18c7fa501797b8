"""Size, time and concurrency limits on the averager's inbound libp2p streams.

What it overrides: hivemind serves every streaming RPC of the averager (`rpc_join_group`,
`rpc_aggregate_part`, `rpc_download_state`) through `P2P._add_protobuf_stream_handler`, whose
per-stream reader (`_handle_stream` -> `P2P.receive_protobuf` -> `P2P.receive_raw_data`) reads an
8-byte length and then waits for that many bytes, with no cap and no timeout. A peer could declare
a 2^40-byte message and have the averager buffer everything it streams, open hundreds of silent
streams that each hold a file descriptor forever, or stop in the middle of a message and hang the
handler. `guard_stream_handlers(p2p, limits, on_violation)` replaces that one method on the
averager process's own `P2P` instance (not the class, so the DHT process and other P2P users are
untouched) with `_GuardedStreams.add_handler`, which serves the same handlers with:

* a cap on every inbound message, checked on its declared length *before* reading its body (the
  averager derives the cap from its model: no honest message is larger than the model in fp32);
* a timeout on the first message and on every later one until the caller's end-of-stream;
* a cap on concurrent streams per peer (the handlers themselves refuse banned peers).

A message over its cap or that does not parse is reported to `on_violation` (the averager bans
its sender); a silent or too slow stream is just closed. `read_message` is the same capped,
timed reader, also used for the state download (`node.averaging.state_sync`), where we are the
client of a possibly hostile peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError, Message
from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.proto.p2pd_pb2 import RPCError

from protocol.errors import InvalidMessage
from protocol.limits import MAX_AVERAGER_STREAMS_PER_PEER, MAX_END_OF_STREAM_BYTES

__all__ = ["StreamLimits", "StreamViolation", "guard_stream_handlers", "read_message"]

logger = logging.getLogger(__name__)

_END_OF_STREAM = object()


class StreamViolation(InvalidMessage):
    """A peer sent a message over its cap, with an unknown marker, or that does not parse."""


@dataclass(frozen=True)
class StreamLimits:
    """The limits applied to each inbound averager stream."""

    message_timeout_s: float
    """Longest wait for the first message of a stream, and for each later one until end-of-stream."""

    default_max_bytes: int
    """Cap on one inbound message of a type not in `max_bytes_by_type`."""

    max_bytes_by_type: dict[type[Message], int] = field(default_factory=dict)
    """Caps of particular request types (the all-reduce's tensor parts are larger than requests)."""

    max_streams_per_peer: int = MAX_AVERAGER_STREAMS_PER_PEER
    """Most streams one peer may hold open at once; more are closed at once."""

    def max_bytes(self, message_type: type[Message]) -> int:
        return self.max_bytes_by_type.get(message_type, self.default_max_bytes)


async def read_message(
    reader: asyncio.StreamReader, message_type: type[Message], max_bytes: int, timeout_s: float
) -> Message | None:
    """Read one framed message (marker, 8-byte length, body); None for the end-of-stream marker.

    Raises `StreamViolation` for a length over `max_bytes` (before reading the body), an unknown
    marker or a body that does not parse; `TimeoutError` if the whole message takes longer than
    `timeout_s`; `asyncio.IncompleteReadError` if the peer closed the stream.
    """
    async with asyncio.timeout(timeout_s):
        marker = await reader.readexactly(1)
        if marker not in (P2P.MESSAGE_MARKER, P2P.ERROR_MARKER):
            raise StreamViolation(f"unknown message marker {marker!r}")
        is_message = marker == P2P.MESSAGE_MARKER
        cap = max_bytes if is_message else MAX_END_OF_STREAM_BYTES
        length = int.from_bytes(await reader.readexactly(P2P.HEADER_LEN), P2P.BYTEORDER)
        if length > cap:
            raise StreamViolation(f"a message declares {length} bytes, over the cap of {cap}")
        body = await reader.readexactly(length)
    try:
        parsed = (message_type if is_message else RPCError).FromString(body)
    except DecodeError as e:
        raise StreamViolation(f"a message does not parse: {e}") from e
    return parsed if is_message else None


async def _put_unless_done(queue: asyncio.Queue[Any], item: Any, consumer: asyncio.Task[None]) -> bool:
    """Put `item` in `queue`; False if `consumer` finished first (then nobody would ever take it)."""
    putting = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({putting, consumer}, return_when=asyncio.FIRST_COMPLETED)
    if putting.done():
        return True
    putting.cancel()
    return False


def guard_stream_handlers(
    p2p: P2P, limits: StreamLimits, on_violation: Callable[[PeerID, str], object]
) -> None:
    """Serve every stream handler later added to `p2p` under `limits` (see module docstring)."""
    guard = _GuardedStreams(p2p, limits, on_violation)
    p2p._add_protobuf_stream_handler = guard.add_handler  # type: ignore[method-assign]


class _GuardedStreams:
    """The replacement of `P2P._add_protobuf_stream_handler` for one `P2P` instance."""

    def __init__(self, p2p: P2P, limits: StreamLimits, on_violation: Callable[[PeerID, str], object]) -> None:
        self.p2p, self.limits, self.on_violation = p2p, limits, on_violation
        self.open_streams: Counter[PeerID] = Counter()

    async def add_handler(
        self,
        name: str,
        handler: Callable[[AsyncIterator[Any], P2PContext], AsyncIterator[Any]],
        input_protobuf_type: type[Message],
        max_prefetch: int = 5,
        balanced: bool = False,
    ) -> None:
        max_bytes = self.limits.max_bytes(input_protobuf_type)

        async def serve(info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = info.peer_id
            with closing(writer):
                if self.open_streams[peer] >= self.limits.max_streams_per_peer:
                    logger.info(
                        "%s: refused a stream from %s: it holds %d already",
                        name,
                        peer,
                        self.open_streams[peer],
                    )
                    return
                self.open_streams[peer] += 1
                try:
                    await self._serve(
                        name, handler, input_protobuf_type, max_bytes, max_prefetch, peer, reader, writer
                    )
                finally:
                    self.open_streams[peer] -= 1
                    if self.open_streams[peer] <= 0:
                        del self.open_streams[peer]

        await self.p2p.add_binary_stream_handler(name, serve, balanced=balanced)

    async def _serve(
        self,
        name: str,
        handler: Callable[[AsyncIterator[Any], P2PContext], AsyncIterator[Any]],
        message_type: type[Message],
        max_bytes: int,
        max_prefetch: int,
        peer: PeerID,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        context = P2PContext(handle_name=name, local_id=self.p2p.peer_id, remote_id=peer)
        requests: asyncio.Queue[Any] = asyncio.Queue(max_prefetch)

        async def request_stream() -> AsyncIterator[Any]:
            while (request := await requests.get()) is not _END_OF_STREAM:
                yield request

        async def respond() -> None:
            try:
                async for response in handler(request_stream(), context):
                    try:
                        await P2P.send_protobuf(response, writer)
                    except Exception:  # the caller closed or broke the stream: nobody to answer
                        logger.debug("%s: could not send a response to %s", name, peer, exc_info=True)
                        return
            except Exception as e:
                logger.warning("%s: handler failed for %s: %r", name, peer, e)
                with suppress(Exception):
                    await P2P.send_protobuf(RPCError(message=str(e)), writer)

        responding = asyncio.create_task(respond())
        try:
            await self._receive(name, message_type, max_bytes, peer, reader, requests, responding)
        finally:
            responding.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await responding

    async def _receive(
        self,
        name: str,
        message_type: type[Message],
        max_bytes: int,
        peer: PeerID,
        reader: asyncio.StreamReader,
        requests: asyncio.Queue[Any],
        responding: asyncio.Task[None],
    ) -> None:
        """Feed the handler until end-of-stream, then wait for the handler or for the caller to close."""
        while True:
            receiving = asyncio.ensure_future(
                read_message(reader, message_type, max_bytes, self.limits.message_timeout_s)
            )
            await asyncio.wait({responding, receiving}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():  # the handler finished first: it closes the stream
                receiving.cancel()
                with suppress(BaseException):
                    await receiving
                return
            try:
                request = receiving.result()
            except asyncio.IncompleteReadError:
                return  # the caller closed the stream (cancelled or died)
            except TimeoutError:
                logger.info(
                    "%s: closed a stream from %s: no message within %.1f s",
                    name,
                    peer,
                    self.limits.message_timeout_s,
                )
                return
            except StreamViolation as e:
                self.on_violation(peer, f"stream:{name.rsplit('.', 1)[-1]}: {e}")
                return
            if not await _put_unless_done(
                requests, _END_OF_STREAM if request is None else request, responding
            ):
                return
            if request is None:
                break
        # After end-of-stream the caller only waits for responses; any byte it sends is a violation.
        trailing = asyncio.ensure_future(reader.read(1))
        await asyncio.wait({responding, trailing}, return_when=asyncio.FIRST_COMPLETED)
        if not trailing.done():
            trailing.cancel()
            with suppress(BaseException):
                await trailing
            return
        if trailing.exception() is None and trailing.result():
            self.on_violation(peer, f"stream:{name.rsplit('.', 1)[-1]}: data after end-of-stream")
