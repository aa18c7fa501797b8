"""The inference worker's generation loop: seeded sampling with TOPLOC proofs built on the fly.

`generate` decodes with the model's key/value cache, samples each token with the seeded
Gumbel-max sampler (`training.sampling`), keeps the bf16 final hidden state that produced
each token, and hands every complete chunk of 32 rows to a proof builder as soon as it is
full (a background thread by default, so decoding never waits for it); the proofs are ready
when the last token is, with no pass over the activations at the end.

Which rows are proved: completion token `i` is sampled from the logits at sequence position
`len(prompt) + i - 1`, and the final hidden state at that same position is row `i` of the
proved activations. A verifier's single prefill over `prompt + completion` yields exactly
these rows (`hidden[len(prompt) - 1 : -1]`) and the logits that must re-select every token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from protocol.toploc import CHUNK_TOKENS, TOPK, build_proofs
from training.causal_lm import CausalLM
from training.sampling import SamplingParams, sample_tokens

__all__ = ["Choice", "Generation", "ProofBuilder", "generate", "generate_group"]


class ProofBuilder:
    """Builds one TOPLOC proof per full chunk of hidden rows, inline or on a background thread.

    With `background=True` each chunk's proof is built on a single worker thread while the
    caller keeps decoding; `finish()` builds the last (partial) chunk and returns all proofs
    in chunk order. `cpu_seconds` counts the CPU time spent building proofs, on whichever thread.
    """

    def __init__(self, chunk_tokens: int = CHUNK_TOKENS, topk: int = TOPK, background: bool = False) -> None:
        self.chunk_tokens = chunk_tokens
        self.topk = topk
        self._rows: list[torch.Tensor] = []
        self._pending: list[Future[list[bytes]] | list[bytes]] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toploc") if background else None
        self._caller_cpu_s = 0.0
        self._background_cpu_s = 0.0  # written by the background thread only

    @property
    def cpu_seconds(self) -> float:
        """CPU time spent on the proofs so far, on the caller's thread and the background one."""
        return self._caller_cpu_s + self._background_cpu_s

    def _build_in_background(self, chunk: torch.Tensor) -> list[bytes]:
        started = time.thread_time()
        proofs = build_proofs(chunk, self.chunk_tokens, self.topk)
        self._background_cpu_s += time.thread_time() - started
        return proofs

    def _submit(self) -> None:
        started = time.thread_time()
        chunk = torch.cat(self._rows, dim=0)
        self._rows = []
        if self._pool is None:
            self._pending.append(build_proofs(chunk, self.chunk_tokens, self.topk))
        else:
            self._pending.append(self._pool.submit(self._build_in_background, chunk))
        self._caller_cpu_s += time.thread_time() - started

    def add(self, rows: torch.Tensor) -> None:
        """Append bf16 hidden rows `[n, H]`; a proof starts as soon as a chunk is full."""
        for row in rows.split(1, dim=0) if rows.shape[0] > 1 else (rows,):
            self._rows.append(row)
            if len(self._rows) == self.chunk_tokens:
                self._submit()

    def finish(self) -> list[bytes]:
        """Prove any remaining rows and return every proof, in order."""
        if self._rows:
            self._submit()
        proofs: list[bytes] = []
        for item in self._pending:
            proofs.extend(item.result() if isinstance(item, Future) else item)
        self.close()
        self._pending = []
        return proofs

    def close(self) -> None:
        """Stop the background thread (idempotent; pending proofs are finished first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


@dataclass
class Generation:
    """One completion: its tokens, the proofs over its hidden states, and what produced them."""

    completion_ids: list[int]
    """Sampled token ids (byte values for the default vocabulary)."""

    proofs: list[bytes]
    """One TOPLOC proof per 32 completion tokens (258 bytes each with k = 128)."""

    hidden: torch.Tensor = field(repr=False)
    """The proved bf16 final hidden states `[len(completion_ids), d_model]` (kept for debugging/bench)."""

    logits: torch.Tensor = field(repr=False)
    """The logits each token was sampled from, `[len(completion_ids), vocab]` in the model's dtype."""

    proof_cpu_seconds: float = 0.0
    """CPU time spent building `proofs` (the proof overhead of this generation)."""


Choice = Callable[[int, int, torch.Tensor, int], int]
"""`choose(row, i, logits, sampled) -> token`: replaces the sampler's choice for completion `i` of `row`."""


@torch.inference_mode()
def generate(
    model: CausalLM,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    params: SamplingParams,
    seed: int,
    *,
    stop_ids: Collection[int] = (),
    chunk_tokens: int = CHUNK_TOKENS,
    topk: int = TOPK,
    background_proofs: bool = True,
    choose: Callable[[int, torch.Tensor, int], int] | None = None,
    prove: bool = True,
) -> Generation:
    """Sample up to `max_new_tokens` tokens after `prompt_ids` with seeded sampling and prove them.

    Runs in the model's dtype with its key/value cache. Generation stops after any token of `stop_ids`
    (which is included) or at `max_new_tokens`. Sampling noise depends only on `(seed, i)`
    for completion index `i`, so the same call always returns the same tokens and proofs.

    Each full chunk's proof is built on a background thread while decoding continues
    (`background_proofs=False` builds it inline, about 1% of the generation time).
    `prove=False` skips the proofs (a baseline for measuring their cost).
    `choose(i, logits, sampled) -> token` replaces the sampler's choice; it exists only to
    simulate dishonest workers (greedy decoding, swapped tokens) in tests and benchmarks.
    """
    one = None if choose is None else (lambda _row, i, logits, sampled: choose(i, logits, sampled))
    return generate_group(
        model,
        prompt_ids,
        max_new_tokens,
        params,
        [seed],
        stop_ids=stop_ids,
        chunk_tokens=chunk_tokens,
        topk=topk,
        background_proofs=background_proofs,
        choose=one,
        prove=prove,
    )[0]


def _seeded_choices(logits: torch.Tensor, params: SamplingParams, seeds: Sequence[int], i: int) -> list[int]:
    """The seeded sampler's token at completion index `i` for each row of `logits [B, V]` (row b: `seeds[b]`)."""
    return [int(sample_tokens(logits[b : b + 1], params, seed, [i])[0]) for b, seed in enumerate(seeds)]


@torch.inference_mode()
def generate_group(
    model: CausalLM,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    params: SamplingParams,
    seeds: Sequence[int],
    *,
    stop_ids: Collection[int] = (),
    chunk_tokens: int = CHUNK_TOKENS,
    topk: int = TOPK,
    background_proofs: bool = False,
    choose: Choice | None = None,
    prove: bool = True,
) -> list[Generation]:
    """`generate` for each of `seeds` after one prompt, decoded together as one batch.

    Row b samples with `seeds[b]`, so its tokens are what `generate` with that seed picks from the
    batch's logits; the prompt is computed once for the whole batch (one prefill of B copies), and
    each decode step feeds all rows at once. A row that has stopped keeps being fed its last token
    until the others stop (its outputs are dropped). With native kernels the rows' figures can
    differ from one-row decoding by rounding (the batch shape picks the kernel's blocking); the
    run's calibrated verification policy allows that noise. Proofs are built inline, except for a
    single row with `background_proofs`.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt_ids) + max_new_tokens > model.max_seq_len + 1:
        raise ValueError(
            f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"max_seq_len ({model.max_seq_len}) + 1"
        )
    model.eval()
    stops = frozenset(stop_ids)
    rows = len(seeds)
    ids = torch.tensor([list(prompt_ids)] * rows, dtype=torch.long, device=model.device)
    logits, hidden, cache = model.prefill_cache(ids)
    step_logits, step_hidden = logits[:, -1], hidden[:, -1]
    builders = [
        ProofBuilder(chunk_tokens, topk, background=background_proofs and rows == 1) for _ in range(rows)
    ]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    kept_hidden: list[list[torch.Tensor]] = [[] for _ in range(rows)]
    kept_logits: list[list[torch.Tensor]] = [[] for _ in range(rows)]
    active = list(range(rows))
    try:
        for i in range(max_new_tokens):
            cpu_logits = step_logits.cpu()
            cpu_hidden = step_hidden.to(device="cpu", dtype=torch.bfloat16)
            sampled = _seeded_choices(cpu_logits, params, seeds, i)
            for b in active:
                token = sampled[b] if choose is None else choose(b, i, cpu_logits[b], sampled[b])
                tokens[b].append(token)
                kept_hidden[b].append(cpu_hidden[b : b + 1])
                kept_logits[b].append(cpu_logits[b : b + 1])
                if prove:
                    builders[b].add(cpu_hidden[b : b + 1])
            active = [b for b in active if tokens[b][-1] not in stops]
            if i + 1 == max_new_tokens or not active:
                break
            feed = torch.tensor([[row[-1]] for row in tokens], device=ids.device)
            step_logits, step_hidden = model.decode_step(feed, cache)
            step_logits, step_hidden = step_logits[:, -1], step_hidden[:, -1]
        proofs = [builder.finish() for builder in builders]
    finally:
        for builder in builders:
            builder.close()
    return [
        Generation(
            completion_ids=tokens[b],
            proofs=proofs[b],
            hidden=torch.cat(kept_hidden[b], dim=0),
            logits=torch.cat(kept_logits[b], dim=0),
            proof_cpu_seconds=builders[b].cpu_seconds,
        )
        for b in range(rows)
    ]
