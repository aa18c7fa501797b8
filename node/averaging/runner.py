"""The all-reduce of one round: every sender counts equally, every part is checked, every member ends equal.

`RobustAllReduceRunner` is a `hivemind` `AllReduceRunner`:

* Each reducer combines the senders' inputs of a part with an aggregation rule
  (`node.averaging.robust`: CenteredClip by default, "mean" for the plain equal-weight mean):
  `RobustPartReducer` keeps every accepted input of the current part and aggregates them, in
  sender order, once all have arrived.
* It ignores the `weight` field of every message (each sender counts 1) and its caller splits
  the vector in equal shares (ignoring claimed bandwidths).
* As a reducer it decodes and checks every part before it is accumulated: wrong shape,
  non-finite values, or a norm above `max_norm_ratio` times the expected scale (see
  `_bound_for`) gets the sender refused for the round (`refused`; the averager then bans it).
  A reducer's returned average is checked the same way; a bad one counts as a failed reducer
  (zero update for that slice) and a refusal.
* The reducer encodes each averaged part once and sends every member the same bytes, and it
  uses the decoded bytes itself too, so every member holds the bit-identical average.

**A lying reducer.** Every member receives every part's average from the part's reducer, and
after the outer step every member's `outer_hash` is gathered at the next round's matchmaking
(`node.averaging.rounds`): members whose hash is not the group's majority are told they are
out of sync and download the majority's state.

* Caught: a reducer that sends different averages to different members (equivocation). The
  members it lied to hold another state; while they are a minority of the next round's group
  they resync to the majority's state, so the corruption does not last (tested in
  `tests/integration/diloco/test_diloco_robust_reducer.py`). The lying reducer is not identified
  or banned: a hash mismatch does not say which reducer caused it.
* A reducer that sends the *same* wrong average of its part to every member passes the hash
  check (every member holds the same state); the reducer audit (`node.averaging.audit`) has
  every part reduced by a second member and leaves out the parts whose two averages differ.
  Reducers stack their inputs in PeerID order (`RobustPartReducer.sender_ranks`) so that two
  honest reducers of a part return the same bits. `part_reducers` records who reduced what.
* Not caught: a reducer that drops an honest sender's part claiming a refusal, when the
  audit's other reducer of that part drops it too (only that sender notices: it is left out
  and resyncs).

`global_norm` is the L2 norm of a list of tensors, shared with the averager's rounds;
`norm_bound` the largest norm a reducer accepts for a part.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer
from hivemind.compression import CompressionBase, CompressionInfo
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils.asyncio import aiter_with_timeout, attach_event_on_finished

from node.averaging.codecs import decode_tensor
from node.averaging.robust import DEFAULT_RULE, AggregationRule, aggregate
from protocol.errors import InvalidMessage

__all__ = ["RobustAllReduceRunner", "RobustPartReducer", "global_norm", "norm_bound"]

logger = logging.getLogger(__name__)


def global_norm(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of all `tensors` taken together (0.0 for none), accumulated in float64."""
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))


def norm_bound(
    part: torch.Tensor,
    expected_norm: float,
    total_numel: int,
    max_norm_ratio: float,
    min_norm_per_value: float,
) -> float:
    """Largest acceptable norm for a part shaped like the reducer's own `part`.

    `max_norm_ratio` times the larger of: the part's own norm, the expected whole norm (the
    reducer's or the group's last average) scaled to the part's share of `total_numel` values
    (a slice barely trained is not held to its own tiny norm), and a small absolute floor.
    """
    numel = part.numel()
    spread = expected_norm * (numel / max(1, total_numel)) ** 0.5
    floor = min_norm_per_value * numel**0.5
    return max_norm_ratio * max(float(part.norm()), spread, floor)


class RobustPartReducer(TensorPartReducer):
    """A `TensorPartReducer` that keeps each sender's input of the current part and aggregates them with `rule`."""

    def __init__(
        self,
        part_shapes: Sequence[torch.Size],
        num_senders: int,
        rule: AggregationRule,
        sender_ranks: Sequence[int] | None = None,
    ) -> None:
        """`sender_ranks[i]`: where sender i's input goes in the stack the rule aggregates (default: i)."""
        self.rule = rule
        self.sender_ranks = list(range(num_senders)) if sender_ranks is None else list(sender_ranks)
        self.inputs: dict[int, torch.Tensor] = {}
        super().__init__(part_shapes, num_senders)

    def reset_accumulators(self) -> None:
        super().reset_accumulators()
        self.inputs = {}

    async def accumulate_part(
        self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
    ) -> torch.Tensor:
        """Keep the part, wait for all other senders' inputs of it, return their aggregate (`weight` is ignored)."""
        assert 0 <= sender_index < self.num_senders, "invalid sender index"
        assert 0 <= part_index < self.num_parts, "invalid part index"
        self.num_parts_received[sender_index] += 1
        while part_index > self.current_part_index:
            await asyncio.wait(
                {self.current_part_future, asyncio.create_task(self.finished.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if self.finished.is_set():
                raise AllreduceException(f"attempted to aggregate part in a finalized {type(self).__name__}")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was banned in background")
        assert part_index == self.current_part_index
        future = self.current_part_future
        if part_index < self.sender_failed_after[sender_index]:
            self.inputs[sender_index] = tensor_part
            self.current_part_accumulated_from += 1
            self.check_current_part_finished()
        return await future

    def check_current_part_finished(self) -> None:
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from == self.num_current_senders:
            shape = self.part_shapes[self.current_part_index]
            if self.inputs:
                order = sorted(self.inputs, key=self.sender_ranks.__getitem__)
                stacked = torch.stack([self.inputs[i].reshape(shape) for i in order])
                result = aggregate(self.rule, stacked.to(torch.float32))
            else:
                result = torch.zeros(shape)
            self.current_part_future.set_result(result)
            self.reset_accumulators()


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
        aggregation: AggregationRule = DEFAULT_RULE,
        **kwargs: Any,
    ) -> None:
        kwargs["weight"] = 1.0  # our own contribution counts 1, like everyone else's
        kwargs.pop("modes", None)
        super().__init__(compression=codec, **kwargs)
        self.aggregation = aggregation
        if aggregation != "mean":  # "mean" keeps hivemind's running sum, the behaviour before robust rules
            # the one hivemind built goes unused: no "received 0%" warning when it is collected
            self.tensor_part_reducer.finished.set()  # type: ignore[has-type]
            # Inputs are stacked in PeerID order, not group order: any member reducing this part
            # of the same inputs gets the same bits (`node.averaging.audit` compares two reducers).
            by_peer = sorted(
                range(len(self.sender_peer_ids)), key=lambda i: self.sender_peer_ids[i].to_bytes()
            )
            self.tensor_part_reducer = RobustPartReducer(
                tuple(part.shape for part in self.parts_for_local_averaging),
                len(self.sender_peer_ids),
                aggregation,
                sender_ranks=[by_peer.index(i) for i in range(len(by_peer))],
            )
        self.codec = codec
        self.max_norm_ratio = max_norm_ratio
        self.min_norm_per_value = min_norm_per_value
        self.pre_banned = [p for p in pre_banned if p in self.sender_peer_ids and p != self.peer_id]
        self.refused: dict[PeerID, str] = {}
        self.received_bytes: Counter[PeerID] = Counter()
        """Encoded bytes of the accepted parts and averages each peer sent us (what a training receipt attests)."""
        local = kwargs["tensors"]
        own_norm = global_norm(local)
        # The scale honest pseudo-gradients are expected at: our own, or the group's last average
        # (`reference_norm`) when ours is smaller, e.g. after a resync left us few inner steps.
        self._expected_norm = max(own_norm, reference_norm)
        self._own_numel = sum(t.numel() for t in local)
        self._encoded: dict[int, asyncio.Task[tuple[runtime_pb2.Tensor, torch.Tensor]]] = {}
        container = self.tensor_part_container
        self.part_reducers: list[tuple[PeerID, int]] = [
            (self.ordered_peer_ids[peer_index], part.numel())
            for peer_index, parts in enumerate(container._input_parts_by_peer)
            for part, _ in parts
        ]
        """Who reduces each part of the flattened vector and its length, in order (parts are
        assigned to peers in the group's order, so this is the vector's order too)."""

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
                self.received_bytes[sender] += len(message.tensor_part.buffer)
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
            loop = asyncio.get_event_loop()
            for part_index, tensor_part in enumerate(self.parts_for_local_averaging):
                # Our own input goes through the codec too, as every other sender's reaches us and
                # ours reaches the audit's other reducer of this part: both then reduce the same values.
                own = await loop.run_in_executor(None, self._through_codec, tensor_part)
                averaged = await self.tensor_part_reducer.accumulate_part(
                    sender_index, part_index, own, weight=1.0
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
                self.received_bytes[peer_id] += len(message.tensor_part.buffer)
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

    def _through_codec(self, part: torch.Tensor) -> torch.Tensor:
        """`part` as another member receives it: encoded with the round's codec and decoded."""
        return decode_tensor(self.codec.compress(part, CompressionInfo.from_tensor(part)))

    def _bound_for(self, reference: torch.Tensor) -> float:
        """`norm_bound` for a part shaped like our `reference` part."""
        return norm_bound(
            reference, self._expected_norm, self._own_numel, self.max_norm_ratio, self.min_norm_per_value
        )
