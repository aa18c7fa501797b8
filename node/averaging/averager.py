"""DiLoCo's averaging on hivemind: one robust all-reduce of pseudo-gradients per outer step.

`DiLoCoAverager` is a `hivemind.DecentralizedAverager` whose buffers hold this peer's
pseudo-gradient. It implements `training.diloco.RoundAverager` (through the `Rounds` mixin)
and `StateSource` (through `StateSharing`); this module holds its core:

* **One all-reduce per outer step.** The result of the round is the group's aggregate
  pseudo-gradient (`aggregation`: CenteredClip by default, or the plain mean; see
  `node.averaging.robust`), copied into the buffers; there is no second state-averaging round.
* **Equal weights, whatever peers claim.** Each round runs a `RobustAllReduceRunner` with
  equal shares for every peer that accepts connections (claimed bandwidths are ignored).
* **Admission.** A run may name its trainers (`admitted_trainers`): then only they are
  looked for in matchmaking, let into our groups, and counted as sources of steps and state, so
  identities minted by anyone cannot crowd the matchmaking or outvote the run's step. An open
  run (the default) names none.
* **Bans.** A sender whose part the runner refused is banned in this averager's process
  (`node.bans.BanList`: `ban_base_s`, doubling with every offence, capped at
  `ban_base_s * 2**10`): it cannot join our groups, its parts are refused while the ban
  lasts, and we download no state from it.
* **Bit-identical results.** The runner gives every member the same averaged bytes; a member
  that a reducer failed reports the round as incomplete (see `node.averaging.rounds`).
* **Audited reducers.** With `audit_reducers` (the default) every part is reduced a second time
  by another member and a part whose two averages differ is not applied (`node.averaging.audit`),
  so a reducer that lies the same way to every member corrupts nothing.
* **Signed declarations.** Matchmaking and state-sharing declarations in the DHT are signed by
  this averager (`node.averaging.declarations`); the record validator refuses unsigned ones.
* **Bounded streams.** Every inbound stream is capped in size (from the model's size), timed
  out and counted per peer before hivemind reads it (`node.averaging.stream_limits`); a peer
  that sends an oversized or malformed message is banned.
* **Forked safely.** Importing this module gives every process forked after it one torch thread,
  set before the child starts any other (`node.torch_fork`): torch's thread pool and OpenMP are
  not fork-safe, and the averager process runs torch in several threads from its first round.
* **Bytes sent** are counted where the averager process writes to libp2p streams
  (`node.averaging.traffic`), so matchmaking, all-reduce and state downloads are all included.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing as mp
import typing
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import enter_asynchronously

from node.averaging.audit import audit_group_id, compare, rotated
from node.averaging.codecs import codec_for, install_hivemind_codecs
from node.averaging.declarations import install_signed_matchmaking
from node.averaging.robust import DEFAULT_RULE, AggregationRule
from node.averaging.rounds import Rounds
from node.averaging.runner import RobustAllReduceRunner
from node.averaging.stream_limits import StreamLimits, guard_stream_handlers
from node.averaging.traffic import count_sent_bytes
from node.bans import BanList
from node.dht_node import signing_key_of
from node.torch_fork import install_torch_fork_safety
from protocol.limits import AVERAGER_MESSAGE_SLACK_BYTES, MAX_AVERAGER_REQUEST_BYTES

__all__ = ["MAX_BAN_DOUBLINGS", "DiLoCoAverager"]

logger = logging.getLogger(__name__)

MAX_BAN_DOUBLINGS = 10
"""A peer's ban doubles with each offence up to `ban_base_s * 2**MAX_BAN_DOUBLINGS`."""

install_torch_fork_safety()  # the averager process is forked from its trainer


class DiLoCoAverager(Rounds, DecentralizedAverager):
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
        aggregation: AggregationRule = DEFAULT_RULE,
        trusted_state_sources: Sequence[PeerID] = (),
        admitted_trainers: Sequence[PeerID] = (),
        signing_key: Ed25519PrivateKey | None = None,
        audit_reducers: bool = True,
    ) -> None:
        """`trusted_state_sources`: the run's authorised publishers, whose verified outer state a
        resync takes without a second source (see `node.averaging.state_sync`).
        `admitted_trainers`: when given, the only other trainers this one averages with, takes
        step advertisements from and downloads a state from (a run that names its trainers);
        empty: an open run. `signing_key`: the private key of the DHT's PeerID, which signs our
        DHT declarations (default: the key `node.dht_node` started the DHT with).
        `audit_reducers`: reduce every part twice, by two members, and apply only the parts whose
        averages agree (`node.averaging.audit`; robust rules only)."""
        signing_key = signing_key or signing_key_of(dht)
        if signing_key is None:
            raise ValueError(
                "the averager signs its DHT declarations with the key of the DHT's PeerID: start the "
                "DHT with node.dht_node.start_dht or start_loopback_dht, or pass signing_key"
            )
        install_hivemind_codecs()
        self.codec_name = compression
        self.aggregation = aggregation
        self.audit_reducers = audit_reducers and aggregation != "mean"
        self.max_norm_ratio = max_norm_ratio
        self.min_norm_per_value = min_norm_per_value
        self.averaging_timeout_s = averaging_timeout_s
        self.label = name
        self.sender_timeout_s = sender_timeout_s
        self._bytes_sent = mp.Value(ctypes.c_uint64, 0)
        self._disputed_parts = mp.Value(ctypes.c_uint64, 0)
        self._last_average_norm = mp.Value(ctypes.c_double, 0.0)  # set by the host, read by the runner
        # Lives in the averager process (copied there when hivemind starts it).
        self.bans = BanList(ban_base_s, ban_base_s * 2**MAX_BAN_DOUBLINGS, owner=name)
        self._matchmaking_time_s = matchmaking_time_s
        admitted = (
            frozenset([dht.peer_id.to_bytes(), *(p.to_bytes() for p in admitted_trainers)])
            if admitted_trainers
            else None
        )
        self._init_state_sharing(signing_key, trusted_state_sources, admitted)
        self._init_rounds()
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

    def bytes_sent(self) -> int:
        """Bytes the averager process wrote to libp2p streams so far."""
        return int(self._bytes_sent.value)

    def disputed_parts(self) -> int:
        """Parts left out of rounds so far because their two reducers returned different averages."""
        return int(self._disputed_parts.value)

    # -- averager process -----------------------------------------------------------------
    def run(self) -> None:
        counter = self._bytes_sent

        def count(num_bytes: int, _writer: object) -> None:
            with counter.get_lock():
                counter.value += num_bytes

        count_sent_bytes(count)  # for the whole life of the averager process
        install_hivemind_codecs()
        install_signed_matchmaking(self._signing_key, self._admitted)
        super().run()

    async def add_p2p_handlers(self, p2p: P2P, wrapper: Any = None, **kwargs: Any) -> None:
        # Every inbound stream gets a size cap, timeouts and a per-peer count before hivemind's
        # handlers see it (see `node.averaging.stream_limits`); the process's only P2P is this one.
        guard_stream_handlers(p2p, self.stream_limits(), self.bans.ban)
        await super().add_p2p_handlers(p2p, wrapper, **kwargs)

    def stream_limits(self) -> StreamLimits:
        """Limits on inbound streams: no honest tensor part is larger than the whole model in fp32."""
        model_bytes = 4 * sum(t.numel() for t in self._averaged_tensors)
        return StreamLimits(
            message_timeout_s=self.sender_timeout_s,
            default_max_bytes=MAX_AVERAGER_REQUEST_BYTES,
            max_bytes_by_type={averaging_pb2.AveragingData: model_bytes + AVERAGER_MESSAGE_SLACK_BYTES},
        )

    async def rpc_join_group(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.MessageFromLeader]:  # hivemind needs typing's alias here
        if self.bans.is_banned(context.remote_id):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        if not self.admits(context.remote_id.to_bytes()):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
            return
        async for response in super().rpc_join_group(request, context):
            yield response

    async def _aggregate_with_group(self, group_info: GroupInfo, min_vector_size: int, **kwargs: Any) -> Any:
        outsiders = [peer for peer in group_info.peer_ids if not self.admits(peer.to_bytes())]
        if outsiders:  # a leader that let in a trainer this run does not name
            raise MatchmakingException(f"the group holds trainers this run does not admit: {outsiders}")
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
                refused, complete, received, disputed = await self._run_allreduce_inplace_(
                    local_tensors, group_info, peer_fractions=peer_fractions, **kwargs
                )
            return {
                "gathered": {p.to_bytes(): v for p, v in user_gathered.items()},
                "refused": refused,
                "complete": complete,
                "group_id": group_info.group_id,
                "received": received,
                "disputed": disputed,
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
    ) -> tuple[int, bool, dict[bytes, int], int]:
        """Run the all-reduce into `tensors` (twice, audited, with `audit_reducers`); return (senders
        refused, whether every reducer answered us, bytes received from each peer that was not
        refused, parts left out because their two reducers disagreed)."""
        group_id = group_info.group_id if group_id is None else group_id
        peer_ids = tuple(group_info.peer_ids)
        fractions = tuple(kwargs.pop("peer_fractions"))
        if not (self.audit_reducers and sum(f > 0 for f in fractions) >= 2):
            runner = await self._allreduce_pass(tensors, peer_ids, fractions, group_id, **kwargs)
            return len(runner.refused), _complete(runner), _received(runner), 0
        audit_id = audit_group_id(group_id)
        # Registered before our first pass starts: a member that finishes the first pass sooner
        # may send us its audit parts before we finish ours.
        self._running_groups[audit_id] = asyncio.get_event_loop().create_future()
        try:
            inputs = [t.detach().clone() for t in tensors]
            first = await self._allreduce_pass(tensors, peer_ids, fractions, group_id, **kwargs)
            order, audit_fractions = rotated(peer_ids, fractions)
            second = await self._allreduce_pass(inputs, order, audit_fractions, audit_id, **kwargs)
        finally:
            pending = self._running_groups.pop(audit_id, None)
            if pending is not None and not pending.done():
                pending.cancel()  # members waiting to send us audit parts give up now
        audit = compare(tensors, inputs, first.part_reducers, second.part_reducers)
        for tensor, averaged in zip(tensors, audit.averaged, strict=True):
            tensor.copy_(averaged)
        if audit.disputed_parts:
            with self._disputed_parts.get_lock():
                self._disputed_parts.value += audit.disputed_parts
            logger.warning(
                "%s: %d parts (%d values) left out of the round: their two reducers disagree (%s)",
                self.label,
                audit.disputed_parts,
                audit.disputed_values,
                ", ".join(f"{a} / {b}" for a, b in audit.disputed_pairs),
            )
        refused = {*first.refused, *second.refused}
        received = _received(first)
        for peer, count in _received(second).items():
            received[peer] = received.get(peer, 0) + count
        complete = _complete(first) and _complete(second)
        return len(refused), complete, received, audit.disputed_parts

    async def _allreduce_pass(
        self,
        tensors: Sequence[torch.Tensor],
        peer_ids: Sequence[PeerID],
        fractions: tuple[float, ...],
        group_id: bytes,
        **kwargs: Any,
    ) -> RobustAllReduceRunner:
        """One all-reduce of `tensors` in place, with the group in `peer_ids` order; bans whoever it refused."""
        runner = self.runner_class(
            p2p=self._p2p,
            servicer_type=type(self),
            prefix=self.prefix,
            tensors=tensors,
            group_id=group_id,
            ordered_peer_ids=peer_ids,
            peer_fractions=fractions,
            codec=codec_for(self.codec_name),
            max_norm_ratio=self.max_norm_ratio,
            min_norm_per_value=self.min_norm_per_value,
            reference_norm=float(self._last_average_norm.value),
            pre_banned=[p for p in peer_ids if self.bans.is_banned(p)],
            aggregation=self.aggregation,
            **kwargs,
        )
        self._running_groups[group_id].set_result(runner)
        try:
            async for tensor, averaged in _azip(tensors, runner):
                tensor.copy_(averaged)
        finally:
            for peer_id, reason in runner.refused.items():
                if reason != "banned":
                    self.bans.ban(peer_id, reason)
        return runner


def _complete(runner: RobustAllReduceRunner) -> bool:
    """Whether every reducer answered us: one that failed us (e.g. we were late and it left us out)
    leaves a slice in our result that nobody else holds."""
    return runner.tensor_part_container.failed_size == 0


def _received(runner: RobustAllReduceRunner) -> dict[bytes, int]:
    return {p.to_bytes(): n for p, n in runner.received_bytes.items() if p not in runner.refused}


async def _azip(
    tensors: Sequence[torch.Tensor], runner: AllReduceRunner
) -> AsyncIterator[tuple[torch.Tensor, torch.Tensor]]:
    index = 0
    async for averaged in runner:
        yield tensors[index], averaged
        index += 1
