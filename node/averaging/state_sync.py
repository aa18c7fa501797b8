"""State sharing between the trainers of a run: who is at which outer step, and downloading the state.

`StateSharing` is a mixin of `node.averaging.averager.DiLoCoAverager` (it relies on the hivemind
`DecentralizedAverager` beneath it):

* **Step advertisements.** `publish_step` makes our outer step our state-sharing priority,
  which hivemind declares in the DHT under `protocol.dht_keys.all_averagers_key`;
  `peer_steps` reads every live trainer's advertised step (self-reported, untrusted).
* **Serving.** `set_state_provider` registers the function that returns our current
  `OuterState`; hivemind serves it to peers as `{"step", "hash"}` plus params and momentum.
* **Downloading.** `fetch_state` downloads `(params, momentum, step)` for a late joiner or an
  out-of-sync peer, preferring peers whose hash was the majority of the last round and
  otherwise the median reported step (never the largest claim). A state is refused unless
  it is above the step asked for, has the right shapes and finite values, and fits in the
  expected number of bytes. Banned peers are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.streaming import combine_from_streaming

from node.averaging.outer_state import OuterState
from node.bans import BanList
from protocol.dht_keys import all_averagers_key
from protocol.errors import InvalidMessage

__all__ = ["StateSharing"]

logger = logging.getLogger(__name__)

_MAX_STATE_SLACK_BYTES = 1 << 20
_PEER_POLL_S = 1.0
_STATE_WAIT_S = 10.0  # how long a resync waits for a peer to hold the outer step it needs
_PEERS_CACHE_S = 5.0

if TYPE_CHECKING:  # a mixin of a DecentralizedAverager: type-check it as one
    from hivemind.averaging import DecentralizedAverager as _AveragerBase
else:
    _AveragerBase = object


class StateSharing(_AveragerBase):
    """Outer-step advertisements and outer-state downloads of a `DiLoCoAverager` (see module docstring)."""

    # Provided by `DiLoCoAverager`: its name in logs and the peers it refuses to deal with.
    label: str
    bans: BanList

    def _init_state_sharing(self) -> None:
        """Set up this mixin's fields; called before hivemind starts the averager process."""
        self._state_provider: Callable[[], OuterState] | None = None
        # The peers whose state hash was the majority of our last round (see `prefer_state_sources`).
        self._preferred_sources: list[PeerID] = []
        self._peers_seen = False
        self._peers_checked_at = 0.0

    # -- averager process -------------------------------------------------------------------

    async def _download_state_from(
        self, peer_ids: list[bytes], newer_than: int, max_bytes: int, timeout: float, future: MPFuture
    ) -> None:
        try:
            for raw in peer_ids:
                peer = PeerID(raw)
                if peer == self.peer_id or self.bans.is_banned(peer):
                    continue
                try:
                    result = await asyncio.wait_for(self._download_one(peer, max_bytes), timeout)
                except Exception as e:
                    logger.warning("%s: state download from %s failed: %r", self.label, peer, e)
                    continue
                if result is None:
                    continue
                step = result[0].get("step") if isinstance(result[0], dict) else None
                if not isinstance(step, int) or step <= newer_than:
                    logger.debug(
                        "%s: %s offers outer step %r, not above %d", self.label, peer, step, newer_than
                    )
                    continue
                future.set_result((raw, *result))
                return
        finally:
            if not future.done():
                future.set_result(None)

    async def _download_one(self, peer: PeerID, max_bytes: int) -> tuple[Any, list[torch.Tensor]] | None:
        stub = self.get_stub(self._p2p, peer, namespace=self.prefix)
        stream = await stub.rpc_download_state(averaging_pb2.DownloadRequest())
        metadata: Any = None
        parts: list[runtime_pb2.Tensor] = []
        tensors: list[torch.Tensor] = []
        received = 0
        async for message in stream:
            received += message.ByteSize()
            if received > max_bytes:
                raise InvalidMessage(f"state from {peer} exceeds {max_bytes} bytes")
            if message.metadata:
                metadata = self.serializer.loads(message.metadata)
            if message.tensor_part.dtype and parts:
                tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
                parts = []
            parts.append(message.tensor_part)
        if parts:
            tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
        return None if metadata is None else (metadata, tensors)

    # -- host process -----------------------------------------------------------------------
    def set_state_provider(self, provider: Callable[[], OuterState]) -> None:
        """`provider()` returns the current `OuterState`; it is served to peers that download the state."""
        self._state_provider = provider

    def get_current_state(self) -> tuple[Any, Sequence[torch.Tensor], Any]:
        provider = self._state_provider
        if provider is None:
            return None, [], None  # hivemind treats missing metadata as "no state to share"
        state = provider()
        return {"step": state.step, "hash": state.hash()}, [*state.params, *state.momentum], None

    def publish_step(self, step: int) -> None:
        """Advertise our outer step (as the state-sharing priority) so late joiners know where the run is."""
        if not DecentralizedAverager.allow_state_sharing.fget(self):  # type: ignore[attr-defined]
            self.allow_state_sharing = True
        self.state_sharing_priority = float(step)

    def peer_steps(self) -> dict[bytes, float]:
        """Outer steps that live trainers of this run advertise (self excluded); self-reported, untrusted."""
        found = self.dht.get(all_averagers_key(self.prefix), latest=True)
        steps: dict[bytes, float] = {}
        if found is not None and isinstance(found.value, dict):
            now = get_dht_time()
            for key, item in found.value.items():
                value = getattr(item, "value", None)
                live = getattr(item, "expiration_time", now + 1) > now
                if (
                    isinstance(key, bytes)
                    and key != self.peer_id.to_bytes()
                    and isinstance(value, int | float)
                    and live
                ):
                    steps[key] = float(value)
        return steps

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
        self, *, newer_than: int, timeout_s: float = 60.0, wait_s: float = _STATE_WAIT_S
    ) -> OuterState | None:
        """Download (params, momentum, step) from a peer at an outer step above `newer_than` (see module doc).

        While no candidate has such a state yet (peers may still be applying the outer step that
        made us resync), ask again for up to `wait_s` seconds.
        """
        deadline = time.monotonic() + wait_s
        while True:
            candidates = self._state_sources(newer_than)
            if not candidates:
                return None
            fetched = self._download_state(candidates, newer_than, timeout_s)
            if fetched is not None or time.monotonic() >= deadline:
                return fetched
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

    def _download_state(
        self, candidates: list[bytes], newer_than: int, timeout_s: float
    ) -> OuterState | None:
        total = sum(t.numel() for t in self._averaged_tensors)
        max_bytes = 2 * 4 * total + _MAX_STATE_SLACK_BYTES
        future = MPFuture()
        self._outer_pipe.send(("_download_state_from", [], dict(
            peer_ids=candidates, newer_than=newer_than, max_bytes=max_bytes, timeout=timeout_s,
            future=future)))  # fmt: skip
        result = future.result(timeout=timeout_s * len(candidates) + 10)
        if result is None:
            return None
        source, metadata, tensors = result
        n = len(self._averaged_tensors)
        try:
            step = int(metadata["step"])
            if step <= newer_than or len(tensors) != 2 * n:
                raise ValueError(f"step {step} / {len(tensors)} tensors")
            params = [t.to(torch.float32) for t in tensors[:n]]
            momentum = [t.to(torch.float32) for t in tensors[n:]]
            for t, ref in zip(params + momentum, list(self._averaged_tensors) * 2, strict=True):
                if t.shape != ref.shape or not bool(torch.isfinite(t).all()):
                    raise ValueError("shape or non-finite values")
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("%s: state from %s is unusable (%s)", self.label, PeerID(source), e)
            return None
        return OuterState(params, momentum, step)

    def prefer_state_sources(self, peers: list[PeerID]) -> None:
        """Ask these peers first for the state (the majority of our last round)."""
        self._preferred_sources = peers

    def note_peers_alive(self) -> None:
        """A round just averaged with other trainers: spare the next round's DHT read in `has_peers`."""
        self._peers_seen, self._peers_checked_at = True, time.monotonic()
