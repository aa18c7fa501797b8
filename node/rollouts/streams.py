"""The stream machinery shared by the rollout intakes: one request frame in, one response frame out.

Frames are those of the weight broadcast (`node.broadcast.wire`: a 4-byte length, then the
bytes), so a frame longer than the service's cap is refused after reading its length alone.
`FramedService` serves one libp2p protocol with the hardening every intake needs: banned peers
and peers the stream budget refuses (`node.stream_slots`: a per-peer cap, and a total cap with
fair-share preemption) get an error response before a byte of their stream is parsed (what
they still send is discarded for a moment, so the answer is not lost to a stream reset); a
stream preempted to make room for another peer's is answered "busy: preempted" while it waits
for a frame, never while one is being handled; the first and every later frame must arrive
within `frame_timeout_s`, and each answer must be taken within it too; a frame that
is oversized or that the subclass finds malformed (`InvalidMessage`) gets its sender banned and
an error response, but a stream that ends inside a frame (its sender died or lost the connection
mid-send) is only closed. `exchange` is the requesting side: it dials a peer **by PeerID only** (its
addresses come from the node's own peer store, never from a message), sends one frame and reads
the capped answer under one overall timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import hivemind
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError, P2PHandlerError

from node.bans import BanList
from node.broadcast.wire import TruncatedFrame, read_frame, write_frame
from node.rollouts.config import StreamServiceConfig
from node.rollouts.errors import PeerUnavailable, SubmissionTimeout
from node.rollouts.peers import replicate_p2p
from node.stream_slots import StreamSlot, StreamSlots
from protocol.errors import InvalidMessage
from protocol.limits import MAX_SUBMIT_ERROR_CHARS

logger = logging.getLogger(__name__)


_DISCARD_CHUNK_BYTES = 64 * 1024
PREEMPTED_ERROR = "busy: preempted, this node serves too many streams; try again later"


def clip(text: str) -> str:
    """An error text short enough for a response frame."""
    return text[:MAX_SUBMIT_ERROR_CHARS]


class FramedService:
    """Serves one stream protocol: admission, capped timed frames, bans; subclasses answer frames."""

    name = "framed-service"
    proto = ""
    what = "message"
    """What a frame holds, for ban reasons and logs."""

    def __init__(
        self,
        *,
        dht: hivemind.DHT | None,
        config: StreamServiceConfig,
        max_frame_bytes: int,
        p2p: P2P | None = None,
        bans: BanList | None = None,
        owner: str = "",
    ) -> None:
        self.dht = dht
        self.config = config
        self.max_frame_bytes = max_frame_bytes
        self.owner = owner
        self.bans = bans if bans is not None else BanList(config.ban_base_s, config.ban_max_s, owner=owner)
        self._given_p2p = p2p
        self._p2p: P2P | None = None
        self.slots = StreamSlots(config.max_streams, config.max_streams_per_peer)
        """The streams being served (counts, preemptions)."""
        self.streams_ended = 0
        """Inbound streams served to their end, however they ended (answered, refused, cut short)."""
        self.bytes_responded = 0
        """Bytes of every response frame written (answers and refusals), length prefixes included."""

    @property
    def p2p(self) -> P2P:
        if self._p2p is None:
            raise RuntimeError(f"{self.name} is not running: await start() first")
        return self._p2p

    async def start(self) -> None:
        p2p = self._given_p2p
        if p2p is None:
            if self.dht is None:
                raise ValueError(f"{self.name} needs a DHT (to replicate its P2P daemon) or a P2P instance")
            p2p = await replicate_p2p(self.dht)
        self._p2p = p2p
        try:
            await p2p.add_binary_stream_handler(self.proto, self._serve)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        p2p, self._p2p = self._p2p, None
        if p2p is None:
            return
        with contextlib.suppress(Exception):
            await p2p.remove_binary_stream_handler(self.proto)
        if self._given_p2p is None:
            with contextlib.suppress(Exception):
                await p2p.shutdown()

    # ---- subclass hooks ------------------------------------------------------------------

    def error_response(self, error: str) -> bytes:
        """The serialized response frame that tells the peer `error`."""
        raise NotImplementedError

    def refusal(self, peer: PeerID) -> str | None:
        """Why `peer` may not use this service at all (checked before reading), or None."""
        return None

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        """The response frame to one request frame; raise InvalidMessage to refuse and ban the sender."""
        raise NotImplementedError

    # ---- serving -------------------------------------------------------------------------

    async def _serve(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self.handle_stream(info.peer_id, reader, writer)

    @property
    def open_streams(self) -> int:
        """Streams being served now."""
        return self.slots.total

    def _admission(self, peer: PeerID) -> str | None:
        if self.bans.is_banned(peer):
            return "refused: this peer is banned for sending malformed or oversized messages"
        return self.refusal(peer)

    async def _respond(self, writer: asyncio.StreamWriter, response: bytes) -> None:
        await asyncio.wait_for(write_frame(writer, response), self.config.frame_timeout_s)
        self.bytes_responded += len(response) + 4

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, error: str) -> None:
        """Answer `error`, then discard what the peer still sends until it hangs up (bounded in time and
        bytes). Closing a stream that still has unread inbound data resets it, and the reset can
        overtake the answer: the peer would learn nothing of why it was refused."""
        await self._respond(writer, self.error_response(clip(error)))
        budget = self.max_frame_bytes + 4
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.refusal_linger_s):
                while budget > 0 and (data := await reader.read(min(_DISCARD_CHUNK_BYTES, budget))):
                    budget -= len(data)

    async def handle_stream(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one inbound stream of `peer` to its end (public so tests can drive it without libp2p)."""
        key = peer.to_bytes()
        try:
            refusal = self._admission(peer)
            if refusal is not None:
                await self._refuse(reader, writer, refusal)
                return
            slot = self.slots.admit(key)
            if isinstance(slot, str):
                await self._refuse(reader, writer, f"busy: {slot}")
                return
            if not await self.slots.serve(slot, self._serve_frames(peer, reader, writer, slot)):
                await self._refuse(reader, writer, PREEMPTED_ERROR)
        except TruncatedFrame:
            # a sender that died or lost its connection mid-frame: nothing to answer, nothing to punish
            pass
        except InvalidMessage as exc:
            self.bans.ban(peer, f"bad {self.what}: {exc}")
            with contextlib.suppress(Exception):
                await self._refuse(reader, writer, f"refused, sender banned: {exc}")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        except Exception as exc:  # one bad stream must never take the node down
            logger.info(
                "[%s] %s stream from %s failed: %r", self.owner, self.name, peer.to_base58()[-8:], exc
            )
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self.streams_ended += 1

    async def _serve_frames(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: StreamSlot
    ) -> None:
        while True:
            try:
                frame = await asyncio.wait_for(
                    read_frame(reader, self.max_frame_bytes), self.config.frame_timeout_s
                )
            except TimeoutError:
                await self._respond(
                    writer,
                    self.error_response(
                        f"timed out: no {self.what} within {self.config.frame_timeout_s:g} s"
                    ),
                )
                return
            if frame is None:
                return
            with slot.responding():  # a frame read is answered, even if the stream is preempted meanwhile
                await self._respond(writer, await self.answer(peer, frame))


async def exchange(
    p2p: P2P, peer: PeerID, proto: str, request: bytes, *, max_response_bytes: int, timeout_s: float
) -> bytes:
    """Send one frame to `peer` on a new `proto` stream and return its answer frame.

    Raises SubmissionTimeout if the whole exchange takes longer than `timeout_s`, PeerUnavailable
    if the peer cannot be reached or closes the stream without an answer, and InvalidMessage if
    the answer declares more than `max_response_bytes` (refused before it is buffered).
    """
    short = peer.to_base58()[-8:]
    try:
        async with asyncio.timeout(timeout_s):
            _, reader, writer = await p2p.call_binary_stream_handler(peer, proto)
            try:
                # a peer that refuses us answers first and closes: its reason is still there to be read
                with contextlib.suppress(ConnectionError, OSError):
                    await write_frame(writer, request)
                response = await read_frame(reader, max_response_bytes)
            finally:
                writer.close()
    except TimeoutError:
        raise SubmissionTimeout(f"peer {short} gave no answer on {proto} within {timeout_s:g} s") from None
    except (P2PDaemonError, P2PHandlerError, ConnectionError, OSError) as exc:
        raise PeerUnavailable(f"could not exchange with peer {short} on {proto}: {exc}") from None
    if response is None:
        raise PeerUnavailable(f"peer {short} closed the {proto} stream without an answer")
    return response
