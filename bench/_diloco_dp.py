"""bench/diloco.py's data-parallel baseline: every inner step all-reduces full fp32 gradients.

The same int8/fp32 codec path and all-reduce runner as the DiLoCo trainers
(`node.averaging.runner.RobustAllReduceRunner`), driven in one process for `NUM_TRAINERS`
peers on their own P2P daemons, with the bytes each peer sends counted where they reach libp2p.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
import typing
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from hivemind.p2p import P2P, P2PContext, ServicerBase
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import achain, aiter_with_timeout, anext, as_aiter

from node.averaging.codecs import codec_for
from node.averaging.runner import RobustAllReduceRunner
from node.averaging.traffic import count_sent_bytes
from training.causal_lm import CausalLM
from training.trainer import TrainerConfig, trainer_corpus, trainer_model

NUM_TRAINERS = 4


def held_out_loss(model: CausalLM, batches: list[torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        return sum(float(model.loss(b[:, :-1], b[:, 1:])) for b in batches) / len(batches)


class _ByteCounter:
    """Counts bytes handed to libp2p streams per P2P instance (identified by its unix socket paths)."""

    def __init__(self) -> None:
        self.by_socket: dict[str, int] = defaultdict(int)
        self._undo: Callable[[], None] | None = None

    def _count(self, num_bytes: int, writer: asyncio.StreamWriter) -> None:
        for key in ("peername", "sockname"):
            name = writer.get_extra_info(key)
            if isinstance(name, str) and name:
                self.by_socket[name] += num_bytes
                break

    def install(self) -> None:
        self._undo = count_sent_bytes(self._count)

    def uninstall(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def bytes_of(self, p2p: P2P) -> int:
        paths = {p2p._daemon_listen_maddr["unix"], p2p._client_listen_maddr["unix"]}
        return sum(v for k, v in self.by_socket.items() if k in paths)


class DPServicer(ServicerBase):
    """Routes incoming all-reduce parts to the runner of their group (like DecentralizedAverager does)."""

    def __init__(self) -> None:
        self.groups: dict[bytes, RobustAllReduceRunner] = {}

    async def rpc_aggregate_part(
        self, stream: typing.AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> typing.AsyncIterator[averaging_pb2.AveragingData]:
        request = await anext(stream)
        runner = self.groups.get(request.group_id)
        if runner is None:
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        async for message in runner.rpc_aggregate_part(achain(as_aiter(request), stream), context):
            yield message


class DataParallelGroup:
    """Four P2P daemons on loopback and an all-reduce of one gradient list per peer."""

    def __init__(self, n: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.counter = _ByteCounter()
        self.counter.install()
        self.p2ps: list[P2P] = []
        self.servicers = [DPServicer() for _ in range(n)]
        self._call(self._start(n))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _start(self, n: int) -> None:
        first = await P2P.create()
        self.p2ps.append(first)
        maddrs = await first.get_visible_maddrs()
        for _ in range(n - 1):
            self.p2ps.append(await P2P.create(initial_peers=maddrs))
        for p2p, servicer in zip(self.p2ps, self.servicers, strict=True):
            await servicer.add_p2p_handlers(p2p, namespace="dp")
        for p2p in self.p2ps[1:]:
            await p2p.wait_for_at_least_n_peers(1)

    def average(self, grads_per_peer: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        return self._call(self._average(grads_per_peer))

    async def _average(self, grads_per_peer: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        group_id = secrets.token_bytes(16)
        peer_ids = [p.peer_id for p in self.p2ps]
        runners = []
        for p2p, servicer, grads in zip(self.p2ps, self.servicers, grads_per_peer, strict=True):
            runner = RobustAllReduceRunner(
                p2p=p2p,
                servicer_type=DPServicer,
                prefix="dp",
                group_id=group_id,
                tensors=grads,
                ordered_peer_ids=peer_ids,
                peer_fractions=tuple(1.0 for _ in peer_ids),
                codec=codec_for("fp32"),
                # Per-batch gradients are much noisier than pseudo-gradients: a much looser bound.
                max_norm_ratio=1000.0,
                min_norm_per_value=1e-6,
                sender_timeout=30.0,
                reducer_timeout=60.0,
            )
            servicer.groups[group_id] = runner
            runners.append(runner)

        async def collect(runner: RobustAllReduceRunner) -> list[torch.Tensor]:
            return [t async for t in aiter_with_timeout(runner.run(), 120)]

        try:
            return list(await asyncio.gather(*(collect(r) for r in runners)))
        finally:
            for servicer in self.servicers:
                servicer.groups.pop(group_id, None)

    def bytes_sent(self) -> list[int]:
        return [self.counter.bytes_of(p) for p in self.p2ps]

    def close(self) -> None:
        async def shutdown() -> None:
            for p2p in self.p2ps:
                await p2p.shutdown()

        try:
            self._call(shutdown())
        finally:
            self.counter.uninstall()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


def run_data_parallel(config: TrainerConfig, steps: int) -> dict[str, float]:
    torch.manual_seed(config.seed)
    model = trainer_model(config)
    corpus = trainer_corpus(config)
    samplers = [corpus.sampler(i, NUM_TRAINERS) for i in range(NUM_TRAINERS)]
    eval_batches = corpus.eval_batches(config.eval_batches)
    c = config.diloco
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=c.inner_lr, betas=c.inner_betas, weight_decay=c.inner_weight_decay
    )
    params = list(model.parameters())
    group = DataParallelGroup(NUM_TRAINERS)
    compute = 0.0
    inconsistent = 0
    tokens_per_peer = 0
    start = time.perf_counter()
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            model.train()
            grads_per_peer = []
            for sampler in samplers:
                batch = sampler.next_batch()
                model.zero_grad(set_to_none=True)
                model.loss(batch[:, :-1], batch[:, 1:]).backward()
                grads_per_peer.append(
                    [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
                )
            tokens_per_peer += batch.shape[0] * (batch.shape[1] - 1)
            compute += (time.perf_counter() - t0) / NUM_TRAINERS  # each peer computes one of the four
            averaged = group.average(grads_per_peer)
            # Each peer gets the same bytes unless a reducer failed for some of them (e.g. a timeout
            # under load); then the peers that got zeros for that slice differ. Count it and go on
            # with the average most peers hold (the replica stands for them).
            keys = [b"".join(t.numpy().tobytes() for t in avg) for avg in averaged]
            majority = max(set(keys), key=keys.count)
            if len(set(keys)) > 1:
                inconsistent += 1
            chosen = averaged[keys.index(majority)]
            t1 = time.perf_counter()
            for p, avg in zip(params, chosen, strict=True):
                p.grad = avg
            for param_group in optimizer.param_groups:  # the same schedule, over the same steps
                param_group["lr"] = c.inner_lr_at(step, total_steps=steps)
            torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
            optimizer.step()
            compute += time.perf_counter() - t1
            if step % max(1, steps // 5) == 0:
                print(f"  dp step {step:6d}/{steps}", flush=True)
        wall = time.perf_counter() - start
        sent = group.bytes_sent()
    finally:
        group.close()
    return {
        "loss": held_out_loss(model, eval_batches),
        "bytes_per_token": sum(sent) / NUM_TRAINERS / tokens_per_peer,
        "utilisation": compute / wall,
        "wall_s": wall,
        "inconsistent_steps": float(inconsistent),
    }
