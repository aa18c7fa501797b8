"""Serving and downloading a run's outer state (late joiners, resyncs) over hivemind's public P2P API.

`StateService` registers one binary stream handler (`proto`). A client opens a stream, sends one
request frame (an offer: the state's header only; a download: the header and the payload) and
reads one header frame, then for a download the raw payload (`node.collective.state_wire`).

**Serving, under upload budgets** (`StateServiceConfig`): a flood of requests from many free
identities must not starve the trainer. Banned peers are answered an error before anything is
read; the request frame is capped (`MAX_REQUEST_BYTES`, checked on its length) and must arrive
within `frame_timeout_s`, and streams waiting for their request are capped in total and per peer;
a malformed or oversized request bans its sender. Each peer has a token bucket of requests and
another of downloads per `window_s`: a peer over budget is told "busy: ... try again in N s" and
is never banned for it (it may be honest). Downloads also need one of `max_streams` upload slots
(at most `max_streams_per_peer` per peer), and every upload shares one `RateLimiter` of
`upload_bytes_per_s`. The served state is serialized once, lazily and off the event loop, and its
bytes shared by every upload.

**Downloading** (`fetch`): candidates are
tried in order (trusted ones first), skipping ourselves and banned peers. A state is fully
verified (a step above the one asked for, a payload of exactly the expected size, checked on the
header before the payload is read, finite values, its recomputed `state_hash` equal to the
advertised one); a source that fails this is banned. A verified state is taken at once from a
`trusted` source; otherwise only once two distinct peers that `counts_as_witness` vouch for its
(step, hash), by serving it or by offering it (the caller decides who has standing, so sybil
identities cannot agree a poisoned state into a trainer). A peer that dies mid-transfer, times
out or answers an error only fails its own turn. A caller that polls until a state is confirmed
passes one `FetchProgress` to every call: vouchers then add up across polls, and each source is
asked no faster than its request budget allows (`node.collective.fetch_progress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError, P2PHandlerError

from node.bans import BanList
from node.broadcast.wire import WRITE_SLICE_BYTES, RateLimiter, TruncatedFrame, read_frame, write_frame
from node.collective import state_wire as wire
from node.collective.budgets import MAX_TRACKED_PEERS, PeerBudget
from node.collective.fetch_progress import FetchProgress, FetchResult, Offer
from node.collective.outer_state import OuterState
from node.stream_slots import StreamSlot, StreamSlots
from protocol.errors import HivenetError, InvalidMessage

__all__ = ["FetchProgress", "FetchResult", "Offer", "SourceUnavailable", "StateService", "StateServiceConfig"]

logger = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class StateServiceConfig:
    """Upload budgets and timeouts of a `StateService`."""

    max_streams: int = 2
    """Downloads served at once, in total."""
    max_streams_per_peer: int = 1
    upload_bytes_per_s: float | None = 50e6
    """Total upload rate of every download together (None: uncapped)."""
    downloads_per_peer_per_window: int = 3
    offers_per_peer_per_window: int = 30
    """Requests of any kind (offers and downloads) a peer may make per window."""
    window_s: float = 60.0
    frame_timeout_s: float = 10.0
    """The request must arrive, and each header be taken, within this."""
    payload_timeout_s: float = 600.0
    """A download's peer must take the payload within this many seconds of waiting on its transport
    (time spent waiting for the upload rate is not counted): a reader too slow frees its slot."""
    max_request_streams: int = 32
    """Streams waiting for their request frame, in total and per peer (fair-share preemption)."""
    max_request_streams_per_peer: int = 2
    refusal_linger_s: float = 1.0
    """How long a refused stream is drained before closing, so the answer is not lost to a reset."""

    @property
    def ask_interval_s(self) -> float:
        """How often a downloader asks one source: the pace its request budget allows."""
        return self.window_s / self.offers_per_peer_per_window

    def __post_init__(self) -> None:
        counts = (self.downloads_per_peer_per_window, self.offers_per_peer_per_window)
        if min(counts) < 1 or self.window_s <= 0 or self.frame_timeout_s <= 0:
            raise ValueError("state service budgets, windows and timeouts must be positive")


class _Refused(Exception):
    """Serving ends with this error header; `reason` counts it in `StateService.refusals`."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


class SourceUnavailable(HivenetError):
    """A peer gave no state: unreachable, too slow, or its stream ended early (no fault proven)."""


def _short(peer: PeerID) -> str:
    return peer.to_base58()[-8:]


class StateService:
    """Serves this trainer's outer state and downloads the run's (see the module docstring)."""

    name = "outer-state"

    def __init__(
        self,
        p2p: P2P,
        *,
        proto: str,
        shapes: Sequence[Sequence[int]],
        config: StateServiceConfig,
        bans: BanList,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the monotonic seconds of the per-peer budgets (a test's fake one)."""
        self.p2p, self.proto, self.config, self.bans, self.label = p2p, proto, config, bans, label
        self._clock = clock
        self.shapes = [tuple(int(d) for d in shape) for shape in shapes]
        self.expected_bytes = wire.payload_bytes(self.shapes)
        self.limiter = RateLimiter(config.upload_bytes_per_s)
        self.slots = StreamSlots(config.max_streams, config.max_streams_per_peer)
        """Downloads being served."""
        self._pending = StreamSlots(config.max_request_streams, config.max_request_streams_per_peer)
        self._requests = PeerBudget(config.offers_per_peer_per_window, config.window_s, clock)
        self._told: dict[bytes, None] = {}
        """Peers told their request budget is spent (insertion order: the oldest is forgotten first)."""
        self._downloads = PeerBudget(config.downloads_per_peer_per_window, config.window_s, clock)
        self._state: OuterState | None = None
        self._cache: tuple[OuterState, asyncio.Future[wire.SerializedState | None]] | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.answered: Counter[str] = Counter()
        """Requests answered with our state, by kind: "offer" (its header) and "download" (all of it)."""
        self.refusals: Counter[str] = Counter()
        """Refused requests by reason: banned, malformed, timeout, request_streams, request_budget,
        no_state, stale, download_budget, streams, preempted."""

    def new_progress(self) -> FetchProgress:
        """The memory of a download polled over several `fetch` calls, paced by our own budgets
        (every trainer of a run serves under the same ones)."""
        return FetchProgress(
            ask_interval_s=self.config.ask_interval_s, max_wait_s=self.config.window_s, clock=self._clock
        )

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(self.proto, self._serve)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.p2p.remove_binary_stream_handler(self.proto)

    def set_state(self, state: OuterState | None) -> None:
        """Serve `state` from now on (None: nothing). Its tensors must not change afterwards (hand over
        a copy): it is serialized lazily, on the first request."""
        self._state = state
        if self._cache is not None and self._cache[0] is not state:
            self._cache = None

    # ---- serving -----------------------------------------------------------------------------

    async def _serve(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self.handle_stream(info.peer_id, reader, writer)

    async def handle_stream(
        self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one inbound stream of `peer` to its end; never raises."""
        try:
            if self.bans.is_banned(peer):
                raise _Refused("banned", "refused: this peer is banned for sending malformed data")
            if self._shunned(peer.to_bytes()):
                self.refusals["shunned"] += 1
                return  # told once that its budget is spent: its streams now cost a close, nothing more
            request = await self._read_request(peer, reader)
            if request is not None:
                await self._answer(peer, request, writer)
        except _Refused as refused:
            self.refusals[refused.reason] += 1
            with contextlib.suppress(Exception):
                await self._refuse(reader, writer, refused.error)
        except TruncatedFrame:
            pass  # a peer that died mid-request: nothing to answer, nothing to punish
        except InvalidMessage as exc:
            self.refusals["malformed"] += 1
            self.bans.ban(peer, f"state request: {exc}")
            with contextlib.suppress(Exception):
                await self._refuse(reader, writer, f"refused, sender banned: {exc}")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        except Exception as exc:  # one bad stream must never take the node down
            logger.info("%s: state stream from %s failed: %r", self.label, _short(peer), exc)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _shunned(self, peer: bytes) -> bool:
        """A peer told that its request budget is spent, whose budget is still spent."""
        if peer not in self._told:
            return False
        if self._requests.exhausted(peer):
            return True
        del self._told[peer]
        return False

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, error: str) -> None:
        """Answer `error`, then drain what the peer still sends (bounded): closing a stream with unread
        inbound data resets it, and the reset can overtake the answer."""
        frame = wire.encode_error(error)
        await asyncio.wait_for(write_frame(writer, frame), self.config.frame_timeout_s)
        self.bytes_sent += len(frame) + 4
        budget = wire.MAX_REQUEST_BYTES + 4
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.refusal_linger_s):
                while budget > 0 and (data := await reader.read(budget)):
                    budget -= len(data)

    async def _read_request(self, peer: PeerID, reader: asyncio.StreamReader) -> wire.Request | None:
        slot = self._pending.admit(peer.to_bytes())
        if isinstance(slot, str):
            raise _Refused("request_streams", f"busy: {slot}")
        frames: list[bytes | None] = []

        async def read() -> None:
            frames.append(await read_frame(reader, wire.MAX_REQUEST_BYTES))

        try:
            async with asyncio.timeout(self.config.frame_timeout_s):
                served = await self._pending.serve(slot, read())
        except TimeoutError:
            timeout = self.config.frame_timeout_s
            raise _Refused("timeout", f"timed out: no request within {timeout:g} s") from None
        if not served:
            raise _Refused("preempted", "busy: preempted, too many streams wait for their request")
        frame = frames[0]
        return None if frame is None else wire.parse_request(frame)

    async def _answer(self, peer: PeerID, request: wire.Request, writer: asyncio.StreamWriter) -> None:
        key = peer.to_bytes()
        if wait := self._requests.take(key):
            self._told[key] = None
            if len(self._told) > MAX_TRACKED_PEERS:
                del self._told[next(iter(self._told))]
            raise _Refused(
                "request_budget", f"busy: state request budget spent; try again in {math.ceil(wait)} s"
            )
        served = await self._serialized()
        if served is None:
            raise _Refused("no_state", "no state: this trainer serves none now")
        if served.step <= request.newer_than:
            raise _Refused("stale", f"stale: at outer step {served.step}, not above {request.newer_than}")
        header = wire.encode_header(served.step, served.hash, len(served.payload))
        if request.kind == wire.OFFER:
            await self._send_header(writer, header)
            self.answered["offer"] += 1
            return
        if wait := self._downloads.take(key):
            raise _Refused(
                "download_budget", f"busy: state upload budget spent; try again in {math.ceil(wait)} s"
            )
        slot = self.slots.admit(key)
        if isinstance(slot, str):
            self._downloads.refund(key)
            raise _Refused("streams", f"busy: {slot}")
        if not await self.slots.serve(slot, self._upload(slot, writer, header, served.payload)):
            raise _Refused("preempted", "busy: preempted by another peer's download")
        self.answered["download"] += 1

    async def _send_header(self, writer: asyncio.StreamWriter, header: bytes) -> None:
        await asyncio.wait_for(write_frame(writer, header), self.config.frame_timeout_s)
        self.bytes_sent += len(header) + 4

    async def _upload(
        self, slot: StreamSlot, writer: asyncio.StreamWriter, header: bytes, payload: memoryview
    ) -> None:
        with slot.responding():
            await self._send_header(writer, header)
            budget = self.config.payload_timeout_s  # of waiting on the transport, not on the rate cap
            for offset in range(0, len(payload), WRITE_SLICE_BYTES):
                piece = payload[offset : offset + WRITE_SLICE_BYTES]
                await self.limiter.consume(len(piece))
                writer.write(piece)
                started = time.monotonic()
                await asyncio.wait_for(writer.drain(), timeout=max(budget, 0.0))
                budget -= time.monotonic() - started
                self.bytes_sent += len(piece)

    async def _serialized(self) -> wire.SerializedState | None:
        """The served state in wire form: serialized once per state, off the event loop, then cached."""
        state = self._state
        if state is None:
            return None
        cache = self._cache
        if cache is None or cache[0] is not state:
            cache = self._cache = (state, asyncio.ensure_future(asyncio.to_thread(self._serialize, state)))
        return await asyncio.shield(cache[1])

    def _serialize(self, state: OuterState) -> wire.SerializedState | None:
        try:
            return wire.serialize_state(state, self.shapes)
        except ValueError as exc:  # a bug of the caller, logged once: the outcome is cached
            logger.error("%s: cannot serve the outer state: %s", self.label, exc)
            return None

    # ---- downloading -------------------------------------------------------------------------

    async def query(
        self, peer: PeerID, *, download: bool, newer_than: int, timeout_s: float
    ) -> tuple[wire.Header, bytearray | None]:
        """Ask `peer` for its state's header (and payload if `download`), all under `timeout_s`.

        An error header is returned as is. Raises InvalidMessage if the peer breaks the protocol
        (a malformed header, a payload size but the expected one, a step not above `newer_than`), and
        SourceUnavailable if it cannot be reached, does not answer in time or ends the stream early.
        """
        kind = wire.DOWNLOAD if download else wire.OFFER
        try:
            async with asyncio.timeout(timeout_s):
                _, reader, writer = await self.p2p.call_binary_stream_handler(peer, self.proto)
                try:
                    with contextlib.suppress(ConnectionError, OSError):  # a refusal is still there to read
                        await write_frame(writer, wire.encode_request(kind, newer_than))
                    frame = await read_frame(reader, wire.MAX_HEADER_BYTES)
                    if frame is None:
                        raise SourceUnavailable("closed the stream without an answer")
                    self.bytes_received += len(frame) + 4
                    header = wire.parse_header(frame)
                    if header.error:
                        return header, None
                    if header.payload_bytes != self.expected_bytes:
                        raise InvalidMessage(
                            f"declares a {header.payload_bytes}-byte state where {self.expected_bytes} are expected"
                        )
                    if header.step <= newer_than:
                        raise InvalidMessage(f"serves outer step {header.step}, not above {newer_than}")
                    return header, (await self._read_payload(reader) if download else None)
                finally:
                    writer.close()
        except TimeoutError:
            raise SourceUnavailable(f"no complete answer within {timeout_s:g} s") from None
        except TruncatedFrame as exc:
            raise SourceUnavailable(str(exc)) from None
        except (P2PDaemonError, P2PHandlerError, ConnectionError, OSError) as exc:
            raise SourceUnavailable(f"unreachable: {wire.clip(repr(exc))}") from None

    async def _read_payload(self, reader: asyncio.StreamReader) -> bytearray:
        payload = bytearray(self.expected_bytes)
        view, received = memoryview(payload), 0
        while received < len(payload):
            chunk = await reader.read(min(_READ_CHUNK_BYTES, len(payload) - received))
            if not chunk:
                raise TruncatedFrame(f"stream ended after {received} of {len(payload)} payload bytes")
            view[received : received + len(chunk)] = chunk
            received += len(chunk)
            self.bytes_received += len(chunk)
        return payload

    async def fetch(
        self,
        candidates: Sequence[PeerID],
        *,
        newer_than: int,
        trusted: frozenset[bytes] = frozenset(),
        counts_as_witness: Callable[[bytes], bool] = lambda peer: True,
        timeout_s: float,
        progress: FetchProgress | None = None,
    ) -> FetchResult:
        """The run's state at an outer step above `newer_than`, by the trust rules of the module
        docstring. `timeout_s` bounds each request to one candidate (an offer or a download).

        `progress` (`new_progress`) carries what earlier calls of a caller polling for confirmation
        learnt: the states it downloaded (each is downloaded once; the other candidates are asked for
        their offers only), who vouched for which, and when each peer may be asked again.
        """
        progress = progress if progress is not None else self.new_progress()
        held = progress.held
        me = self.p2p.peer_id
        ordered = sorted(dict.fromkeys(candidates), key=lambda p: p.to_bytes() not in trusted)
        for peer in ordered:
            raw = peer.to_bytes()
            if peer == me or self.bans.is_banned(peer) or not progress.may_ask(raw):
                continue
            witness = counts_as_witness(raw)
            offer_only = bool(held) and raw not in trusted
            if offer_only and not witness:
                continue  # its word cannot confirm a state we hold, and its own state could never be taken
            try:
                progress.asked(raw)
                header, payload = await self.query(
                    peer, download=not offer_only, newer_than=newer_than, timeout_s=timeout_s
                )
                if header.error:
                    progress.asked(raw, header.error)
                    raise SourceUnavailable(f"answered {header.error!r}")
                key = (header.step, header.hash)
                progress.vouch(key, raw)
                if offer_only and key not in held:
                    header, payload = await self.query(
                        peer, download=True, newer_than=newer_than, timeout_s=timeout_s
                    )
                    if header.error:
                        progress.asked(raw, header.error)
                        raise SourceUnavailable(f"answered {header.error!r}")
                if payload is not None:
                    key = (header.step, header.hash)
                    state = await asyncio.to_thread(
                        wire.decode_state, payload, self.shapes, header.step, header.hash
                    )
                    if raw in trusted:
                        logger.info(
                            "%s: taking the state of trusted source %s (outer step %d, hash %s)",
                            self.label, _short(peer), *key,
                        )  # fmt: skip
                        return FetchResult("agreed", peer, state)
                    progress.hold(key, peer, state)
                    progress.vouch(key, raw)
            except InvalidMessage as exc:
                progress.withdraw(raw)
                self.bans.ban(peer, f"state: {exc}")
                continue
            except SourceUnavailable as exc:
                logger.info("%s: no state from %s: %s", self.label, _short(peer), exc)
                continue
            if (agreed := progress.confirmed(counts_as_witness)) is not None:
                key, witnesses = agreed
                source, state = held[key]
                logger.info(
                    "%s: %d peers vouch for the state of %s (outer step %d, hash %s)",
                    self.label, witnesses, _short(source), *key,
                )  # fmt: skip
                return FetchResult("agreed", source, state)
        if not held:
            return FetchResult("none")
        offers = tuple(Offer(source, step, digest) for (step, digest), (source, _) in held.items())
        return FetchResult("unconfirmed", offers=offers)
