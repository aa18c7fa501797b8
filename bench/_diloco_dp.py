"""bench/diloco.py's data-parallel baseline: every step averages the four peers' full fp32 gradients.

The `NUM_TRAINERS` peers share one model replica (every peer of a data-parallel group holds the
same parameters after each step, so one replica stands for all of them): each computes the
gradient of its own batch, and the step applies the exact fp32 mean of the four gradients,
computed in this process (no network).

Bytes are counted analytically, as a bandwidth-optimal ring all-reduce of the fp32 gradients:
each of N peers sends `2 * (N - 1) / N * 4 * num_params` bytes per step (reduce-scatter, then
all-gather). This is the lower bound of any data-parallel all-reduce of fp32 gradients, with no
framing, protocol or matchmaking overhead counted, so the bytes-per-token reduction that
bench/diloco.py derives for DiLoCo from it (whose bytes are measured on the wire) is
conservative. Utilisation is one peer's compute (its gradient and the optimizer step) over its
compute plus the in-process mean: no communication time is modelled, so it is close to 1 by
construction, not a measurement. `wall_s` is the whole loop's, which computes all four peers'
gradients one after the other.
"""

from __future__ import annotations

import time

import torch

from training.causal_lm import CausalLM
from training.trainer import TrainerConfig, trainer_corpus, trainer_model

NUM_TRAINERS = 4


def held_out_loss(model: CausalLM, batches: list[torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        return sum(float(model.loss(b[:, :-1], b[:, 1:])) for b in batches) / len(batches)


def ring_allreduce_bytes_per_peer(num_params: int, num_peers: int = NUM_TRAINERS) -> float:
    """Bytes each peer sends in one bandwidth-optimal ring all-reduce of `num_params` fp32 values."""
    return 2 * (num_peers - 1) / num_peers * 4 * num_params


def mean_gradients(grads_per_peer: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The exact fp32 mean of the peers' gradients, tensor by tensor."""
    return [torch.stack(grads).mean(dim=0) for grads in zip(*grads_per_peer, strict=True)]


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
    step_bytes = ring_allreduce_bytes_per_peer(sum(p.numel() for p in params))
    compute = averaging = 0.0
    tokens_per_peer = 0
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        model.train()
        grads_per_peer = []
        for sampler in samplers:
            batch = sampler.next_batch()
            model.zero_grad(set_to_none=True)
            model.loss(batch[:, :-1], batch[:, 1:]).backward()
            grads_per_peer.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        tokens_per_peer += batch.shape[0] * (batch.shape[1] - 1)
        compute += (time.perf_counter() - t0) / NUM_TRAINERS  # each peer computes one of the four
        t1 = time.perf_counter()
        averaged = mean_gradients(grads_per_peer)
        averaging += time.perf_counter() - t1
        t1 = time.perf_counter()
        for p, avg in zip(params, averaged, strict=True):
            p.grad = avg
        for param_group in optimizer.param_groups:  # the same schedule, over the same steps
            param_group["lr"] = c.inner_lr_at(step, total_steps=steps)
        torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
        optimizer.step()
        compute += time.perf_counter() - t1
        if step % max(1, steps // 5) == 0:
            print(f"  dp step {step:6d}/{steps}", flush=True)
    wall = time.perf_counter() - start
    return {
        "loss": held_out_loss(model, eval_batches),
        "bytes_per_token": step_bytes * steps / tokens_per_peer,
        "utilisation": compute / (compute + averaging),
        "wall_s": wall,
    }
