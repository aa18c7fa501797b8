"""DiLoCo's averaging round on hivemind: one robust all-reduce of pseudo-gradients per outer step.

`DiLoCoAverager` is a `hivemind.DecentralizedAverager` whose buffers hold this peer's
pseudo-gradient. It implements `training.diloco.RoundAverager` and `StateSource`:

* **One all-reduce per outer step.** The result of the round is the group's mean
  pseudo-gradient, copied into the buffers; there is no second state-averaging round.
* **Matchmaking ahead of time.** `prepare_round` starts matchmaking for outer step `t` when
  the inner steps start, with the all-reduce scheduled for when they are expected to end;
  `average` then only triggers it. Groups are keyed by the outer step (the group bits
  encode `t`), so peers only ever average pseudo-gradients of the same step.
* **Equal weights, whatever peers claim.** `RobustAllReduceRunner` ignores the `weight`
  field of every message (each sender counts 1) and splits the vector in equal shares
  (ignoring claimed bandwidths). As a reducer it decodes and checks every part before it is
  accumulated: wrong shape, non-finite values, or a norm above `max_norm_ratio` times the
  reducer's own part (or, if larger, the group's last average, so that a reducer whose own
  pseudo-gradient is small, e.g. after it resynced late in a round, does not refuse honest
  peers; plus a small floor) gets the sender refused for the round and banned
  for `ban_base_s * 2**(offences-1)` seconds. A reducer's returned average is checked the
  same way; a bad one counts as a failed reducer (zero update for that slice) and a ban.
* **Bit-identical results.** The reducer encodes each averaged part once and sends every
  member the same bytes; it uses the decoded bytes itself too. Every member therefore ends
  with the same averaged tensor and applies the same outer step. A member that a reducer
  failed (e.g. it triggered after the reducers' sender timeout and was left out) holds its
  own values in that slice: it reports the round as out of sync and adopts a peer's state.
* **State sharing.** Peers publish their outer step as their state-sharing priority; a late
  joiner or an out-of-sync peer downloads `(params, momentum, step)` with `fetch_state`,
  preferring peers whose hash was the majority of the last round and otherwise the median
  reported step (never the largest claim).
* **Bytes sent** are counted where the averager process writes to libp2p streams
  (`P2P.send_raw_data`), so matchmaking, all-reduce and state downloads are all included.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import multiprocessing as mp
import random
import statistics
import time
import typing
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.averaging.partition import AllreduceException, BannedException
from hivemind.compression import CompressionBase, CompressionInfo, deserialize_torch_tensor
from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.asyncio import aiter_with_timeout, attach_event_on_finished, enter_asynchronously
from hivemind.utils.streaming import combine_from_streaming

from protocol.errors import InvalidMessage
from training.codecs import codec_for, decode_tensor, install_hivemind_codecs
from training.diloco import DoneAverage, OuterState, PendingAverage, RoundOutcome

__all__ = ["DiLoCoAverager", "RobustAllReduceRunner", "averaging_prefix"]

logger = logging.getLogger(__name__)

_MAX_STATE_SLACK_BYTES = 1 << 20
_PEER_POLL_S = 1.0
_STATE_WAIT_S = 10.0  # how long a resync waits for a peer to hold the outer step it needs


def averaging_prefix(run_id: str) -> str:
    """The hivemind averaging prefix (DHT key namespace, no dots) of a run's trainers."""
    from protocol.dht_keys import validate_run_id

    return "hivenet_diloco_" + validate_run_id(run_id).replace(".", "_")


def _global_norm(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of all `tensors` taken together (0.0 for none), accumulated in float64."""
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))


class RobustAllReduceRunner(AllReduceRunner):
    """An AllReduceRunner that weighs every sender equally, validates parts, and returns identical averages."""

    def __init__(
        self,
        *,
        codec: CompressionBase,
        max_norm_ratio: float,
        min_norm_per_value: float,
        reference_norm: float = 0.0,
        pre_banned: Sequence[PeerID] = (),
        **kwargs: Any,
    ) -> None:
        kwargs["weight"] = 1.0  # our own contribution counts 1, like everyone else's
        kwargs.pop("modes", None)
        super().__init__(compression=codec, **kwargs)
        self.codec = codec
        self.max_norm_ratio = max_norm_ratio
        self.min_norm_per_value = min_norm_per_value
        self.pre_banned = [p for p in pre_banned if p in self.sender_peer_ids and p != self.peer_id]
        self.refused: dict[PeerID, str] = {}
        local = kwargs["tensors"]
        own_norm = _global_norm(local)
        # The scale honest pseudo-gradients are expected at: our own, or the group's last average
        # (`reference_norm`) when ours is smaller, e.g. after a resync left us few inner steps.
        self._expected_norm = max(own_norm, reference_norm)
        self._own_numel = sum(t.numel() for t in local)
        self._encoded: dict[int, asyncio.Task[tuple[runtime_pb2.Tensor, torch.Tensor]]] = {}

    # -- checks ---------------------------------------------------------------------------
    def _bound(self, part_index: int) -> float:
        return self._bound_for(self.parts_for_local_averaging[part_index])

    def _reference(self, peer_index: int, part_index: int) -> torch.Tensor:
        return self.tensor_part_container._input_parts_by_peer[peer_index][part_index][0]

    def check_part(self, tensor: torch.Tensor, reference: torch.Tensor, bound: float) -> str | None:
        """Why `tensor` must be refused as a part shaped like `reference`, or None if it is acceptable."""
        if tensor.shape != reference.shape:
            return f"part of shape {tuple(tensor.shape)}, expected {tuple(reference.shape)}"
        if not bool(torch.isfinite(tensor).all()):
            return "non-finite values"
        norm = float(tensor.norm())
        if norm > bound:
            return f"norm {norm:.3g} above the bound {bound:.3g}"
        return None

    def _refuse(self, peer_id: PeerID, reason: str) -> None:
        if peer_id not in self.refused:
            logger.warning("refusing contribution of %s: %s", peer_id, reason)
            self.refused[peer_id] = reason

    # -- reducer side ---------------------------------------------------------------------
    async def run(self) -> AsyncIterator[torch.Tensor]:
        for peer_id in self.pre_banned:
            self._refuse(peer_id, "banned")
            await self._ban_sender(peer_id)
        async for tensor in super().run():
            yield tensor

    async def _encoded_average(
        self, part_index: int, averaged: torch.Tensor
    ) -> tuple[runtime_pb2.Tensor, torch.Tensor]:
        task = self._encoded.get(part_index)
        if task is None:
            loop = asyncio.get_event_loop()

            def encode() -> tuple[runtime_pb2.Tensor, torch.Tensor]:
                message = self.codec.compress(averaged, CompressionInfo.from_tensor(averaged))
                return message, decode_tensor(message)

            task = asyncio.ensure_future(loop.run_in_executor(None, encode))
            self._encoded[part_index] = task
        return await task

    async def _accumulate_parts_streaming(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], sender_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        sender = self.sender_peer_ids[sender_index]
        part_index = 0
        loop = asyncio.get_event_loop()
        try:
            async for message in stream:
                try:
                    tensor_part = await loop.run_in_executor(None, decode_tensor, message.tensor_part)
                except InvalidMessage as e:
                    self._refuse(sender, str(e))
                    break
                if part_index >= self.tensor_part_reducer.num_parts:
                    self._refuse(sender, "sent more parts than expected")
                    break
                reason = self.check_part(
                    tensor_part, self.parts_for_local_averaging[part_index], self._bound(part_index)
                )
                if reason is not None:
                    self._refuse(sender, reason)
                    break
                try:
                    averaged = await self.tensor_part_reducer.accumulate_part(
                        sender_index, part_index, tensor_part, weight=1.0
                    )
                except BannedException:
                    break
                message_out, _ = await self._encoded_average(part_index, averaged)
                part_index += 1
                yield averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART, tensor_part=message_out)
        finally:
            if part_index != self.tensor_part_reducer.num_parts:
                await self._ban_sender(sender)

    # -- sender side ----------------------------------------------------------------------
    async def _communicate_with_peer(self, peer_id: PeerID) -> None:
        peer_index = self.ordered_peer_ids.index(peer_id)
        if peer_id == self.peer_id:
            sender_index = self.sender_peer_ids.index(peer_id)
            for part_index, tensor_part in enumerate(self.parts_for_local_averaging):
                averaged = await self.tensor_part_reducer.accumulate_part(
                    sender_index, part_index, tensor_part, weight=1.0
                )
                _, decoded = await self._encoded_average(part_index, averaged)
                self.tensor_part_container.register_processed_part(peer_index, part_index, decoded)
            return
        loop = asyncio.get_event_loop()
        try:
            done_sending = asyncio.Event()
            inputs_aiter = attach_event_on_finished(self._generate_input_for_peer(peer_index), done_sending)
            stream = await self._get_peer_stub(peer_id).rpc_aggregate_part(inputs_aiter)
            if self.should_delay_results(self.peer_id):
                await done_sending.wait()
            part_index = 0
            expected = self.tensor_part_container.num_parts_by_peer[peer_index]
            async for message in aiter_with_timeout(stream, self.reducer_timeout):
                if message.code != averaging_pb2.AVERAGED_PART:
                    raise AllreduceException(f"{peer_id} sent {averaging_pb2.MessageCode.Name(message.code)}")
                if part_index >= expected:
                    raise AllreduceException(f"{peer_id} sent more than {expected} parts")
                averaged = await loop.run_in_executor(None, decode_tensor, message.tensor_part)
                reference = self._reference(peer_index, part_index)
                # An honest average is bounded by its reducer's own bound, which may exceed ours: only
                # refuse averages far outside anything honest (a refusal here breaks bit-identity).
                reason = self.check_part(
                    averaged, reference, self.max_norm_ratio * self._bound_for(reference)
                )
                if reason is not None:
                    self._refuse(peer_id, f"bad average from reducer: {reason}")
                    raise AllreduceException(f"reducer {peer_id} returned a bad average: {reason}")
                self.tensor_part_container.register_processed_part(peer_index, part_index, averaged)
                part_index += 1
            if part_index != expected:
                raise AllreduceException(
                    f"peer {peer_id} sent {part_index} parts, but we expected {expected}"
                )
        except BaseException as e:
            if isinstance(e, Exception):
                logger.debug("all-reduce with %s failed: %r", peer_id, e)
            self.tensor_part_container.register_failed_reducer(peer_index)
            raise

    def _bound_for(self, reference: torch.Tensor) -> float:
        """Largest acceptable norm for a part shaped like our `reference` part.

        `max_norm_ratio` times the larger of: our own part's norm, the expected whole norm (ours
        or the group's last average) scaled to the part's share of values (a slice we barely
        trained is not held to its own tiny norm), and a small absolute floor.
        """
        numel = reference.numel()
        spread = self._expected_norm * (numel / max(1, self._own_numel)) ** 0.5
        floor = self.min_norm_per_value * numel**0.5
        return self.max_norm_ratio * max(float(reference.norm()), spread, floor)


class DiLoCoAverager(DecentralizedAverager):
    """Averages pseudo-gradients with the run's trainers and shares the outer state (see module docstring)."""

    runner_class: type[RobustAllReduceRunner] = RobustAllReduceRunner
    """The all-reduce runner used for each round (tests substitute misbehaving ones)."""

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        # hivemind names RPC handlers after the class; pin it so that subclasses interoperate.
        handle_name = f"DiLoCoAverager.{method_name}"
        return f"{namespace}::{handle_name}" if namespace is not None else handle_name

    def __init__(
        self,
        shapes: Sequence[torch.Size],
        dht: DHT,
        *,
        prefix: str,
        compression: str = "int8",
        max_norm_ratio: float = 10.0,
        min_norm_per_value: float = 1e-4,
        ban_base_s: float = 60.0,
        matchmaking_time_s: float = 2.0,
        request_timeout_s: float = 1.0,
        averaging_timeout_s: float = 30.0,
        sender_timeout_s: float = 10.0,
        reducer_timeout_s: float | None = None,
        target_group_size: int | None = None,
        name: str = "trainer",
    ) -> None:
        install_hivemind_codecs()
        self.codec_name = compression
        self.max_norm_ratio = max_norm_ratio
        self.min_norm_per_value = min_norm_per_value
        self.ban_base_s = ban_base_s
        self.averaging_timeout_s = averaging_timeout_s
        self.label = name
        self._bytes_sent = mp.Value(ctypes.c_uint64, 0)
        self._last_average_norm = mp.Value(ctypes.c_double, 0.0)  # set by the host, read by the runner
        self._bans: dict[PeerID, tuple[float, int]] = {}  # lives in the averager process
        self._state_provider: Any = None
        self._control: StepControl | None = None
        self._control_step = -1
        self._preferred_sources: list[PeerID] = []
        self._matchmaking_time_s = matchmaking_time_s
        self._peers_seen = False
        self._peers_checked_at = 0.0
        tensors = [torch.zeros(shape, dtype=torch.float32) for shape in shapes]
        super().__init__(
            tensors,
            dht,
            start=True,
            prefix=prefix,
            target_group_size=target_group_size,
            min_group_size=2,
            initial_group_bits="0",
            min_matchmaking_time=matchmaking_time_s,
            request_timeout=request_timeout_s,
            sender_timeout=sender_timeout_s,
            reducer_timeout=reducer_timeout_s if reducer_timeout_s is not None else 2 * sender_timeout_s,
            allreduce_timeout=averaging_timeout_s,
            next_chunk_timeout=sender_timeout_s,
            compression=codec_for(compression),
            allow_state_sharing=False,  # until publish_step: a peer with no state yet is not a source
            declare_state_period=10.0,
        )

    # -- averager process -----------------------------------------------------------------
    def run(self) -> None:
        counter = self._bytes_sent
        original = P2P.send_raw_data

        async def counted_send_raw_data(
            data: bytes, writer: asyncio.StreamWriter, *, chunk_size: int = 2**16
        ) -> None:
            with counter.get_lock():
                counter.value += len(data) + P2P.HEADER_LEN
            await original(data, writer, chunk_size=chunk_size)

        P2P.send_raw_data = staticmethod(counted_send_raw_data)  # type: ignore[method-assign]
        install_hivemind_codecs()
        super().run()

    def _is_banned(self, peer_id: PeerID) -> bool:
        until = self._bans.get(peer_id, (0.0, 0))[0]
        return time.monotonic() < until

    def _ban(self, peer_id: PeerID, reason: str) -> None:
        offences = self._bans.get(peer_id, (0.0, 0))[1] + 1
        duration = self.ban_base_s * 2 ** min(offences - 1, 10)
        self._bans[peer_id] = (time.monotonic() + duration, offences)
        logger.warning(
            "%s: banned %s for %.0fs (offence %d): %s", self.label, peer_id, duration, offences, reason
        )

    async def rpc_join_group(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.MessageFromLeader]:  # hivemind needs typing's alias here
        if self._is_banned(context.remote_id):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        async for response in super().rpc_join_group(request, context):
            yield response

    async def _aggregate_with_group(self, group_info: GroupInfo, min_vector_size: int, **kwargs: Any) -> Any:
        try:
            _, mode_ids, user_gathered_bytes = zip(
                *map(self.serializer.loads, group_info.gathered), strict=True
            )
            user_gathered = dict(
                zip(group_info.peer_ids, map(self.serializer.loads, user_gathered_bytes), strict=True)
            )
            modes = tuple(AveragingMode(m) if m in (0, 1, 2) else AveragingMode.NODE for m in mode_ids)
            # Equal shares for every peer that accepts connections: claimed bandwidths are ignored.
            peer_fractions = tuple(0.0 if mode == AveragingMode.CLIENT else 1.0 for mode in modes)
            kwargs.pop("weight", None)
            kwargs.pop("compression", None)
            async with enter_asynchronously(self.get_tensors()) as local_tensors:
                refused, complete = await self._run_allreduce_inplace_(
                    local_tensors, group_info, peer_fractions=peer_fractions, **kwargs
                )
            return {
                "gathered": {p.to_bytes(): v for p, v in user_gathered.items()},
                "refused": refused,
                "complete": complete,
            }
        except BaseException as e:
            if isinstance(e, Exception):
                logger.debug("all-reduce failed: %r", e)
            raise MatchmakingException(f"Unable to run All-Reduce: {e}") from e

    async def _run_allreduce_inplace_(  # type: ignore[override]
        self,
        tensors: Sequence[torch.Tensor],
        group_info: GroupInfo,
        group_id: bytes | None = None,
        **kwargs: Any,
    ) -> tuple[int, bool]:
        """Run the all-reduce into `tensors`; return (senders refused, whether every reducer answered us)."""
        group_id = group_info.group_id if group_id is None else group_id
        runner = self.runner_class(
            p2p=self._p2p,
            servicer_type=type(self),
            prefix=self.prefix,
            tensors=tensors,
            group_id=group_id,
            ordered_peer_ids=group_info.peer_ids,
            codec=codec_for(self.codec_name),
            max_norm_ratio=self.max_norm_ratio,
            min_norm_per_value=self.min_norm_per_value,
            reference_norm=float(self._last_average_norm.value),
            pre_banned=[p for p in group_info.peer_ids if self._is_banned(p)],
            **kwargs,
        )
        self._running_groups[group_id].set_result(runner)
        try:
            async for tensor, averaged in _azip(tensors, runner):
                tensor.copy_(averaged)
        finally:
            for peer_id, reason in runner.refused.items():
                if reason != "banned":
                    self._ban(peer_id, reason)
        # A reducer that failed us (e.g. we were late and it left us out) leaves our own pseudo-gradient
        # in its slice: our result is then a mixture nobody else holds.
        return len(runner.refused), runner.tensor_part_container.failed_size == 0

    async def _download_state_from(
        self, peer_ids: list[bytes], newer_than: int, max_bytes: int, timeout: float, future: MPFuture
    ) -> None:
        try:
            for raw in peer_ids:
                peer = PeerID(raw)
                if peer == self.peer_id or self._is_banned(peer):
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

    # -- host process: state sharing --------------------------------------------------------
    def set_state_provider(self, provider: Any) -> None:
        """`provider()` returns the current `OuterState`; it is served to peers that download the state."""
        self._state_provider = provider

    def get_current_state(self) -> tuple[Any, Sequence[torch.Tensor], Any]:
        provider = self._state_provider
        if provider is None:
            return None, [], None  # hivemind treats missing metadata as "no state to share"
        state: OuterState = provider()
        return {"step": state.step, "hash": state.hash()}, [*state.params, *state.momentum], None

    def publish_step(self, step: int) -> None:
        """Advertise our outer step (as the state-sharing priority) so late joiners know where the run is."""
        if not DecentralizedAverager.allow_state_sharing.fget(self):  # type: ignore[attr-defined]
            self.allow_state_sharing = True
        self.state_sharing_priority = float(step)

    def peer_steps(self) -> dict[bytes, float]:
        """Outer steps that live trainers of this run advertise (self excluded); self-reported, untrusted."""
        found = self.dht.get(f"{self.prefix}.all_averagers", latest=True)
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

    def _has_peers(self) -> bool:
        """Whether any other trainer of the run is alive (cached for a few seconds: one DHT read).

        A round that just averaged with other peers is proof enough (it refreshes the cache), so a
        trainer in a healthy run does not block on a DHT read between two rounds.
        """
        now = time.monotonic()
        if now - self._peers_checked_at > 5.0 or not self._peers_seen:
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

    # -- host process: rounds ----------------------------------------------------------------
    def bytes_sent(self) -> int:
        """Bytes the averager process wrote to libp2p streams so far."""
        return int(self._bytes_sent.value)

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str = "") -> None:
        """Start matchmaking for outer step `step` so that the group is ready when the inner steps end."""
        self.cancel_round()
        self.set_group_bits(bin(step)[2:], wait=False)  # the pipe keeps order: applied before the step
        lead = max(self._matchmaking_time_s, 0.9 * expected_duration_s)
        scheduled = get_dht_time() + lead
        self._control = self.step(
            gather={"step": step, "hash": outer_hash},
            scheduled_time=scheduled,
            timeout=lead + self.averaging_timeout_s,
            require_trigger=True,
            allow_retries=True,
            wait=False,
        )
        self._control_step = step

    def cancel_round(self) -> None:
        """Abandon a prepared round (if any)."""
        if self._control is not None and not self._control.done():
            self._control.cancel()
        self._control = None

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        """Start averaging `pseudo_grads` with the group of `step` (alone if no peer is around)."""
        if self._control is None or self._control_step != step:
            self.prepare_round(step, 0.0, outer_hash)
        control = self._control
        assert control is not None
        self._control = None
        # A group that is already assembled (matchmaking ran during the inner steps) proves that
        # peers are there; only otherwise ask the DHT, whose latency would delay the all-reduce.
        assembled = control.stage == AveragingStage.AWAITING_TRIGGER
        if not assembled and not self._has_peers():
            control.cancel()
            return DoneAverage(RoundOutcome(averaged=None, num_peers=1))
        with self.get_tensors() as tensors:
            for buffer, value in zip(tensors, pseudo_grads, strict=True):
                buffer.copy_(value)
        control.allow_allreduce()
        return _PendingRound(self, control, step, outer_hash)

    def average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> RoundOutcome:
        """`start_average(...).result()`: average and wait."""
        return self.start_average(pseudo_grads, step=step, outer_hash=outer_hash).result()

    def _wait_for_round(self, control: StepControl, step: int) -> Any:
        """`control.result()`, but give up on a round that no live peer can join any more.

        A peer that advertises a later outer step has left round `step`: it averaged without us or
        gave up on it. Once every live peer has, waiting out the timeout would only put us a whole
        matchmaking window behind them: each of our later rounds would start just as theirs timed
        out, and no round would find a group again ("could not find a group" every round, seen
        after one trainer stepped alone early). Stepping alone now lets us meet them at the next step.
        """
        deadline = time.monotonic() + control.get_timeout() + self.averaging_timeout_s
        while True:
            try:
                return control.result(timeout=min(_PEER_POLL_S, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                if control.done() or time.monotonic() >= deadline:
                    raise
            if control.stage == AveragingStage.LOOKING_FOR_GROUP:
                steps = self.peer_steps()
                if steps and min(steps.values()) > step:
                    raise MatchmakingException(f"every live peer has moved past outer step {step}")

    def _round_outcome(self, control: StepControl, step: int, outer_hash: str) -> RoundOutcome:
        try:
            result = self._wait_for_round(control, step)
        except Exception as e:  # any failure of the round (no group, timeouts, peers gone): step alone
            logger.info("%s: outer step %d averaged alone (%r)", self.label, step, e)
            with contextlib.suppress(Exception):
                control.cancel()
            return RoundOutcome(averaged=None, num_peers=1)
        if not result:
            return RoundOutcome(averaged=None, num_peers=1)
        gathered: dict[bytes, Any] = result["gathered"]
        hashes = {peer: info.get("hash") for peer, info in gathered.items() if isinstance(info, dict)}
        counts = Counter(h for h in hashes.values() if isinstance(h, str))
        majority = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else outer_hash
        self._preferred_sources = [
            PeerID(p) for p, h in hashes.items() if h == majority and p != self.peer_id.to_bytes()
        ]
        with self.get_tensors() as tensors:
            averaged = [t.clone() for t in tensors]
        norm = _global_norm(averaged)
        if math.isfinite(norm):
            self._last_average_norm.value = norm
        if len(gathered) > 1:  # other trainers are alive: spare the next round's DHT read
            self._peers_seen, self._peers_checked_at = True, time.monotonic()
        complete = bool(result.get("complete", True))
        if not complete:
            logger.warning("%s: outer step %d got only part of the group's average", self.label, step)
        return RoundOutcome(
            averaged=averaged,
            num_peers=len(gathered) - int(result["refused"]),
            in_sync=outer_hash == majority and complete,
            refused_peers=int(result["refused"]),
        )


class _PendingRound:
    """A round in flight on a `DiLoCoAverager` (see `training.diloco.PendingAverage`)."""

    def __init__(self, averager: DiLoCoAverager, control: StepControl, step: int, outer_hash: str) -> None:
        self.averager, self.control, self.step, self.outer_hash = averager, control, step, outer_hash
        self._outcome: RoundOutcome | None = None

    def done(self) -> bool:
        return self._outcome is not None or self.control.done()

    def result(self) -> RoundOutcome:
        if self._outcome is None:
            self._outcome = self.averager._round_outcome(self.control, self.step, self.outer_hash)
        return self._outcome


async def _azip(
    tensors: Sequence[torch.Tensor], runner: AllReduceRunner
) -> AsyncIterator[tuple[torch.Tensor, torch.Tensor]]:
    index = 0
    async for averaged in runner:
        yield tensors[index], averaged
        index += 1
