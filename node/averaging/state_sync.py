"""State sharing between the trainers of a run: who is at which outer step, and downloading the state.

`StateSharing` is a mixin of `node.averaging.averager.DiLoCoAverager` (it relies on the hivemind
`DecentralizedAverager` beneath it):

* **Step advertisements.** `publish_step` makes our outer step our state-sharing priority,
  which we declare in the DHT under `protocol.dht_keys.all_averagers_key`, signed
  (`node.averaging.declarations`; hivemind's own unsigned declaration is replaced);
  `peer_steps` reads every live trainer's advertised step (signed by it, but self-reported:
  untrusted).
* **Serving.** `set_state_provider` registers the function that returns our current
  `OuterState`; hivemind serves it to peers as `{"step", "hash"}` plus params and momentum.
  A trainer whose last round left it out of sync serves nothing until it resyncs or an
  in-sync round vouches for it again: its state is a mixture nobody else holds.
* **Downloading.** `fetch_state` downloads `(params, momentum, step)` for a late joiner or an
  out-of-sync peer, preferring peers whose hash was the majority of the last round and
  otherwise the median reported step (never the largest claim). The stream is read under a
  cap of the expected number of bytes, message by message (`stream_limits.read_message`). A
  state is refused unless it is above the step asked for, has the right dtypes, shapes and
  finite values, and its recomputed `state_hash` is the hash its source advertises (a source
  that fails these checks is banned). Banned peers are skipped.
* **Never one peer's word, unless the run vouches for it.** A verified state is taken once a
  second source serves the same (step, hash) (its metadata suffices), or at once when its source
  is one of the run's authorised publishers (`DiLoCoAverager(trusted_state_sources=...)`: the PeerIDs whose signed
  versions the run's weight broadcast accepts; the libp2p stream authenticates the source's
  PeerID as a signature would). The majority hash of our last round is not an alternative: it
  is the hash of the state *before* that round's outer step, and a resync always asks for a
  later one. Without either, `fetch_state` retries for `wait_s` seconds, then refuses with a
  warning and the caller keeps its own checkpoint or initial state: a run of two trainers that
  name no publishers cannot tell a poisoner from an honest peer (name each other with
  `--publisher` so a diverged one can resync).
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import closing, suppress
from typing import TYPE_CHECKING, Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import P2P, PeerID
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.streaming import combine_from_streaming

from node.averaging.declarations import Declarer, read_declarations
from node.averaging.outer_state import OuterState, state_hash
from node.averaging.stream_limits import read_message
from node.bans import BanList
from protocol.averager_declaration import declaration_payload
from protocol.dht_keys import all_averagers_key
from protocol.errors import InvalidMessage

__all__ = ["StateSharing"]

logger = logging.getLogger(__name__)

_MAX_STATE_SLACK_BYTES = 1 << 20
_PEER_POLL_S = 1.0
_PEERS_CACHE_S = 5.0

if TYPE_CHECKING:  # a mixin of a DecentralizedAverager: type-check it as one
    from hivemind.averaging import DecentralizedAverager as _AveragerBase
else:
    _AveragerBase = object


class StateSharing(_AveragerBase):
    """Outer-step advertisements and outer-state downloads of a `DiLoCoAverager` (see module docstring)."""

    # Provided by `DiLoCoAverager`: its name in logs, the peers it refuses to deal with, and how long
    # a round may take past its schedule.
    label: str
    bans: BanList
    averaging_timeout_s: float

    def _init_state_sharing(
        self,
        signing_key: Ed25519PrivateKey,
        trusted_sources: Sequence[PeerID] = (),
        admitted: frozenset[bytes] | None = None,
    ) -> None:
        """Set up this mixin's fields; called before hivemind starts the averager process.

        `signing_key` (the key of the DHT's PeerID) signs our step advertisements. A verified
        state served by one of `trusted_sources` (the run's authorised publishers) is taken
        without a second source. `admitted`: the only trainers whose step advertisements count
        and who may serve a state (None: every trainer's).
        """
        self._signing_key = signing_key
        self._admitted = admitted
        self._state_provider: Callable[[], OuterState] | None = None
        # Our last round left us out of sync (see `Rounds`): our state is one nobody else holds, and
        # serving it could lead another out-of-sync peer astray. Cleared by a resync or an in-sync round.
        self._state_doubtful = False
        self._trusted_sources = frozenset(p.to_bytes() for p in trusted_sources)
        # The peers whose state hash was the majority of our last round (see `prefer_state_sources`).
        self._preferred_sources: list[PeerID] = []
        self._peers_seen = False
        self._peers_checked_at = 0.0

    # -- averager process -------------------------------------------------------------------

    async def _declare_for_download_periodically(self) -> None:
        """hivemind's state-sharing advertisement, signed: our priority (outer step) under
        `.all_averagers`, renewed every `declare_state_period` and at once when it changes."""
        declarer = Declarer(self.dht, self._signing_key)
        key = all_averagers_key(self.prefix)
        was_sharing = self.allow_state_sharing
        while True:
            self._state_updated.clear()  # before reading the state: a change from now on wakes us
            expiration_time = get_dht_time() + self.declare_state_period
            sharing = self.allow_state_sharing
            if sharing or was_sharing:  # one last declaration when sharing stops, replacing the last one
                payload = declaration_payload(
                    shares_state=sharing, state_priority=self.state_sharing_priority if sharing else 0.0
                )
                try:
                    await asyncio.wait_for(
                        declarer.declare(key, expiration_time, payload), timeout=self.declare_state_period
                    )
                except Exception as exc:  # the next period tries again
                    logger.debug("%s: state-sharing declaration failed: %r", self.label, exc)
                was_sharing = sharing
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._state_updated.wait(), timeout=max(0.0, expiration_time - get_dht_time())
                )

    async def _download_state_from(
        self, peer_ids: list[bytes], newer_than: int, max_bytes: int, timeout: float, future: MPFuture
    ) -> None:
        try:
            future.set_result(await self._agreed_state(peer_ids, newer_than, max_bytes, timeout))
        finally:
            if not future.done():
                future.set_result(None)

    async def _agreed_state(
        self, peer_ids: list[bytes], newer_than: int, max_bytes: int, timeout: float
    ) -> tuple[str, Any]:
        """("agreed", (source, step, tensors)) for the first state two sources agree on or that an
        authorised publisher serves, else ("unconfirmed", offers): the (source, step, hash) of each
        verified state nobody confirmed."""
        verified: dict[tuple[int, str], tuple[bytes, list[torch.Tensor]]] = {}
        trusted = self._trusted_sources
        for raw in sorted(peer_ids, key=lambda p: p not in trusted):  # stable: keeps the preference order
            peer = PeerID(raw)
            if peer == self.peer_id or self.bans.is_banned(peer):
                continue
            try:
                if verified and raw not in trusted:  # a second source need only vouch for a state we hold
                    offer = await asyncio.wait_for(self._state_offer(peer, max_bytes, timeout), timeout)
                    if offer in verified:
                        source, tensors = verified[offer]
                        logger.info(
                            "%s: %s confirms the state of %s (outer step %d, hash %s)",
                            self.label, peer, PeerID(source), *offer,
                        )  # fmt: skip
                        return "agreed", (source, offer[0], tensors)
                    if offer is None or offer[0] <= newer_than:
                        continue
                metadata, tensors = await asyncio.wait_for(
                    self._download_one(peer, max_bytes, timeout), timeout
                )
            except InvalidMessage as e:
                self.bans.ban(peer, f"state: {e}")
                continue
            except Exception as e:
                logger.warning("%s: state download from %s failed: %r", self.label, peer, e)
                continue
            step = metadata.get("step") if isinstance(metadata, dict) else None
            if not isinstance(step, int) or step <= newer_than:
                logger.debug("%s: %s offers outer step %r, not above %d", self.label, peer, step, newer_than)
                continue
            loop = asyncio.get_running_loop()
            problem = await loop.run_in_executor(None, self._state_problem, metadata, tensors)
            if problem is not None:
                self.bans.ban(peer, f"state: {problem}")
                continue
            if raw in trusted:
                logger.info(
                    "%s: taking the state of authorised publisher %s (outer step %d, hash %s)",
                    self.label, peer, step, metadata["hash"],
                )  # fmt: skip
                return "agreed", (raw, step, tensors)
            verified[(step, metadata["hash"])] = (raw, tensors)
        return "unconfirmed", [(source, step, digest) for (step, digest), (source, _) in verified.items()]

    def _state_problem(self, metadata: dict[str, Any], tensors: list[torch.Tensor]) -> str | None:
        """Why a downloaded state is unusable (None if usable): its count, dtypes, shapes, values, hash."""
        n = len(self._averaged_tensors)
        if len(tensors) != 2 * n:
            return f"{len(tensors)} tensors instead of {2 * n}"
        for tensor, ref in zip(tensors, list(self._averaged_tensors) * 2, strict=True):
            if tensor.dtype != torch.float32 or tensor.shape != ref.shape:
                return f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)} instead of {tuple(ref.shape)}"
            if not bool(torch.isfinite(tensor).all()):
                return "non-finite values"
        digest = state_hash(tensors[:n], tensors[n:])
        if metadata.get("hash") != digest:
            return f"its tensors hash to {digest}, not to the advertised {metadata.get('hash')!r}"
        return None

    async def _state_messages(
        self, peer: PeerID, max_bytes: int, timeout: float
    ) -> AsyncGenerator[averaging_pb2.DownloadData, None]:
        """The messages of `peer`'s rpc_download_state, read under a total cap of `max_bytes`.

        Read from the raw stream (not through hivemind's stub, which buffers whatever length a
        message declares) with `node.averaging.stream_limits.read_message`.
        """
        name = self._get_handle_name(self.prefix, "rpc_download_state")
        _, reader, writer = await self._p2p.call_binary_stream_handler(peer, name)
        with closing(writer):
            await P2P.send_protobuf(averaging_pb2.DownloadRequest(), writer)
            await P2P.send_protobuf(P2P.END_OF_STREAM, writer)
            remaining = max_bytes
            while True:
                try:
                    message = await read_message(reader, averaging_pb2.DownloadData, remaining, timeout)
                except asyncio.IncompleteReadError:
                    return  # the server closed the stream: the state is complete (or short, and refused)
                if message is None:
                    return
                assert isinstance(message, averaging_pb2.DownloadData)
                remaining -= message.ByteSize()
                yield message

    def _load_metadata(self, message: averaging_pb2.DownloadData) -> Any:
        try:
            return self.serializer.loads(message.metadata)
        except Exception as e:
            raise InvalidMessage(f"state metadata does not decode: {e!r}") from e

    async def _state_offer(self, peer: PeerID, max_bytes: int, timeout: float) -> tuple[int, str] | None:
        """The (step, hash) that `peer` serves, from the first message of its state (the rest is not read)."""
        messages = self._state_messages(peer, max_bytes, timeout)
        try:
            async for message in messages:
                metadata = self._load_metadata(message) if message.metadata else None
                if not isinstance(metadata, dict):
                    return None
                step, digest = metadata.get("step"), metadata.get("hash")
                return (step, digest) if isinstance(step, int) and isinstance(digest, str) else None
            return None
        finally:
            await messages.aclose()

    async def _download_one(
        self, peer: PeerID, max_bytes: int, timeout: float
    ) -> tuple[Any, list[torch.Tensor]]:
        metadata: Any = None
        grouped: list[list[runtime_pb2.Tensor]] = []  # the parts of each tensor
        async for message in self._state_messages(peer, max_bytes, timeout):
            if message.metadata:
                metadata = self._load_metadata(message)
            if message.tensor_part.dtype or not grouped:
                grouped.append([])
            grouped[-1].append(message.tensor_part)
        try:
            tensors = [deserialize_torch_tensor(combine_from_streaming(parts)) for parts in grouped]
        except Exception as e:
            raise InvalidMessage(f"state tensors do not decode: {e!r}") from e
        return metadata, tensors

    # -- host process -----------------------------------------------------------------------
    def set_state_provider(self, provider: Callable[[], OuterState]) -> None:
        """`provider()` returns the current `OuterState`; it is served to peers that download the state."""
        self._state_provider = provider

    def get_current_state(self) -> tuple[Any, Sequence[torch.Tensor], Any]:
        provider = self._state_provider
        if provider is None or self._state_doubtful:
            return None, [], None  # hivemind treats missing metadata as "no state to share"
        state = provider()
        return {"step": state.step, "hash": state.hash()}, [*state.params, *state.momentum], None

    def publish_step(self, step: int) -> None:
        """Advertise our outer step (as the state-sharing priority) so late joiners know where the run is."""
        if not DecentralizedAverager.allow_state_sharing.fget(self):  # type: ignore[attr-defined]
            self.allow_state_sharing = True
        self.state_sharing_priority = float(step)

    def peer_steps(self) -> dict[bytes, float]:
        """Outer steps that live trainers of this run advertise (self excluded).

        Each was signed by the trainer it names, but is what that trainer says: untrusted.
        """
        key = all_averagers_key(self.prefix)
        me = self.peer_id.to_bytes()
        return {
            d.peer: d.state_priority
            for d in read_declarations(self.dht.get(key, latest=True), key)
            if d.shares_state and d.peer != me and self.admits(d.peer)
        }

    def admits(self, peer: bytes) -> bool:
        """Whether `peer` may average with us and serve us a state (every peer, in an open run)."""
        return self._admitted is None or peer in self._admitted

    def has_peers(self) -> bool:
        """Whether any other trainer of the run is alive (cached for a few seconds: one DHT read).

        A round that just averaged with other peers is proof enough (it refreshes the cache), so a
        trainer in a healthy run does not block on a DHT read between two rounds.
        """
        now = time.monotonic()
        if now - self._peers_checked_at > _PEERS_CACHE_S or not self._peers_seen:
            self._peers_seen = bool(self.peer_steps())
            self._peers_checked_at = now
        return self._peers_seen

    def fetch_state(
        self, *, newer_than: int, timeout_s: float = 60.0, wait_s: float | None = None
    ) -> OuterState | None:
        """Download (params, momentum, step) at an outer step above `newer_than` that two sources agree on.

        Candidates come from `_state_sources`. The first one's state is downloaded and verified
        (shapes, finite values, and its recomputed `state_hash` equal to the hash it advertises);
        it is taken once another source serves the same (step, hash), or at once from one of the
        run's authorised publishers. While none is taken (peers may still be finishing the round
        that made us resync, or only one other trainer exists), ask again for up to `wait_s`
        seconds (default: the averaging timeout, the longest such a round may take), then give
        up with a warning: the caller keeps its own state (checkpoint or fresh initialisation).
        """
        # The peers that can serve the step we need are finishing the same round, which may take
        # them up to the round's own timeout (a straggler on a loaded machine, seen in CI).
        wait_s = self.averaging_timeout_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        while True:
            candidates = self._state_sources(newer_than)
            if not candidates:
                return None
            verdict, found = self._download_state(candidates, newer_than, timeout_s)
            if verdict == "agreed":
                _, step, tensors = found
                n = len(self._averaged_tensors)
                self._state_doubtful = False
                return OuterState(list(tensors[:n]), list(tensors[n:]), step)
            if time.monotonic() >= deadline:
                if found:
                    offers = ", ".join(f"{PeerID(p)} at step {s} hash {h}" for p, s, h in found)
                    logger.warning(
                        "%s: refusing unconfirmed outer state (%s): no second source served the same "
                        "hash within %.0f s; keeping our own state",
                        self.label, offers, wait_s,
                    )  # fmt: skip
                else:
                    logger.warning(
                        "%s: no peer served a state past outer step %d within %.0f s; keeping our own state",
                        self.label, newer_than, wait_s,
                    )  # fmt: skip
                return None
            time.sleep(_PEER_POLL_S / 2)

    def _state_sources(self, newer_than: int) -> list[bytes]:
        """Peers to download the state from, best first: last round's majority, then the median step."""
        steps = self.peer_steps()
        candidates = [p.to_bytes() for p in self._preferred_sources]
        others = [k for k, s in steps.items() if s > newer_than and k not in candidates]
        if others:
            median = statistics.median_low([steps[k] for k in others])
            others.sort(key=lambda k: (abs(steps[k] - median), random.random()))
        return candidates + others

    def _download_state(self, candidates: list[bytes], newer_than: int, timeout_s: float) -> tuple[str, Any]:
        total = sum(t.numel() for t in self._averaged_tensors)
        max_bytes = 2 * 4 * total + _MAX_STATE_SLACK_BYTES
        future = MPFuture()
        self._outer_pipe.send(("_download_state_from", [], dict(
            peer_ids=candidates, newer_than=newer_than, max_bytes=max_bytes, timeout=timeout_s,
            future=future)))  # fmt: skip
        # Each candidate costs at most a metadata read and a download.
        result = future.result(timeout=2 * timeout_s * len(candidates) + 10)
        return ("unconfirmed", []) if result is None else result

    def prefer_state_sources(self, peers: list[PeerID]) -> None:
        """Ask these peers first for the state (the majority of our last round)."""
        self._preferred_sources = peers

    def note_peers_alive(self) -> None:
        """A round just averaged with other trainers: spare the next round's DHT read in `has_peers`."""
        self._peers_seen, self._peers_checked_at = True, time.monotonic()
