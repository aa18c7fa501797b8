"""A small byte-level causal language model (GPT-style) for training and verified inference.

`TinyGPT` is the model DiLoCo trains and inference workers sample from. It is deliberately
small (about 0.9M parameters with the default `ModelConfig`) so that the whole pipeline,
including TOPLOC proofs and their verification, runs on CPU in tests.

Two ways to run it, which must agree up to floating-point noise:

* `forward` / `forward_with_hidden`: one pass over a whole `[B, T]` batch (training, and the
  verifier's prefill).
* `prefill_cache` + `decode_step`: incremental decoding with a key/value cache (generation).
* `forward_shared_prefix`: several right-padded sequences after one shared prefix, computing
  the prefix once and only their real rows (the verifier's pass over a group's completions);
  `forward_shared_prefixes` does it for several prefixes in one pass (several groups).

The "final hidden state" is the output of the final RMS norm, just before the LM head; it is
what TOPLOC proves. The model runs in float32, bfloat16 or float16 (`model.to(dtype)`).

Every operation (matmul, norm, attention, GELU) takes inputs stored in the model's dtype,
accumulates in a wider type and rounds its output once to the model's dtype, as accelerator
kernels do. With autograd off (inference: generation and verification) the wider type is
float64: its rounding noise is ~1e-16, far below the ulp of any storage dtype, so a row's
result does not depend on how many rows are computed with it, and incremental decoding
reproduces a prefill bit for bit in float32, bfloat16 and float16 alike. That is what lets
a verifier hold an honest worker to zero TOPLOC error while still seeing the rounding
pattern of a different precision (see `protocol/verification_policy.py`). With autograd on
(training) the wider type is float32, for speed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from torch.nn import functional as F

from training.causal_lm import CausalLM, SharedPrefixPart, part_shape
from training.ragged import Ragged, plan

__all__ = ["KVCache", "ModelConfig", "TinyGPT"]


class ModelConfig(BaseModel):
    """Shape of a `TinyGPT`. Changing any field changes the weights' shapes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(default=256, ge=2, le=65536)
    """Number of token ids; 256 means byte-level (token id = byte value)."""

    d_model: int = Field(default=128, ge=8)
    """Width of the residual stream (the hidden size TOPLOC proves)."""

    n_layers: int = Field(default=4, ge=1)
    """Number of transformer blocks."""

    n_heads: int = Field(default=4, ge=1)
    """Number of attention heads; must divide `d_model`."""

    max_seq_len: int = Field(default=512, ge=2)
    """Longest sequence (prompt + completion) in tokens; size of the learned position table."""

    mlp_ratio: int = Field(default=4, ge=1)
    """Hidden width of each MLP as a multiple of `d_model`."""

    norm_eps: float = Field(default=1e-5, gt=0.0)
    """Epsilon added to the mean square in every RMS norm."""

    tie_embeddings: bool = True
    """Whether the LM head shares its weight with the token embedding."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        return self

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads


def _acc_dtype() -> torch.dtype:
    """Accumulation dtype: float64 for inference (row-invariant results), float32 for training."""
    return torch.float32 if torch.is_grad_enabled() else torch.float64


class Linear(nn.Linear):
    """Bias-free linear layer: accumulates in `_acc_dtype()`, rounds once to the input's dtype."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)
        self._wide: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def _wide_weight(self, acc: torch.dtype) -> torch.Tensor:
        """The weight in `acc`; at inference the float64 copy is kept until the weight changes.

        Converting every weight on every call costs a verifier's prefill about 8%. The copy is
        tied to the weight tensor itself (kept referenced, so its memory cannot be reused by
        another tensor) and to its in-place version counter (optimizer steps, `load_state_dict`).
        """
        weight = self.weight
        if torch.is_grad_enabled() or weight.dtype == acc or weight.is_inference():
            # Inference tensors have no version counter to tell when the copy went stale.
            return weight.to(acc)
        cached = self._wide
        if cached is None or cached[0] is not weight or cached[1] != weight._version:
            with torch.inference_mode(False), torch.no_grad():
                wide = weight.detach().to(acc)
            cached = self._wide = (weight, weight._version, wide)
        return cached[2]

    def __getstate__(self) -> dict[str, object]:
        # A copied module gets fresh weights with fresh version counters: never a stale copy.
        state = dict(super().__getstate__())
        state["_wide"] = None
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = _acc_dtype()
        return F.linear(x.to(acc), self._wide_weight(acc)).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain, accumulated wide, output in the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = _acc_dtype()
        xf = x.to(acc)
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(acc)
        return out.to(x.dtype)


class KVCache:
    """Per-layer key/value tensors of shape `[B, n_heads, T_cached, head_dim]` for decoding."""

    def __init__(self, n_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        """Number of positions cached so far."""
        k = self.keys[0]
        return 0 if k is None else int(k.shape[2])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's keys/values for `layer` and return the full cached keys/values."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k = torch.cat([old_k, k], dim=2)
            v = torch.cat([old_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


_QUERY_BLOCK = 64
"""Queries per attention call in an inference prefill (see `_causal_attention`)."""


@functools.lru_cache(maxsize=8)
def _additive_causal_mask(t: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[t, past + t]`: 0 where query i may see key j (j <= past + i), -inf elsewhere (shared by layers)."""
    visible = torch.ones(t, past + t, dtype=torch.bool, device=device).tril(diagonal=past)
    return torch.zeros(t, past + t, dtype=dtype, device=device).masked_fill_(~visible, -math.inf)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """Causal attention of `t` new queries over `past + t` keys (`[B, heads, T, head_dim]` each).

    At inference a long prefill attends block by block of `_QUERY_BLOCK` queries, each over
    the keys it can see: CPU attention kernels otherwise work through the masked half of the
    score matrix too (a verifier's attention over 290 tokens: 12 -> 8.3 ms on one thread). In float64
    the split changes nothing once rounded to the model dtype (see the module docstring).
    """
    t = q.shape[2]
    if t == 1:  # one query attends to every cached position: no mask needed
        return F.scaled_dot_product_attention(q, k, v)
    if past == 0 and (t <= _QUERY_BLOCK or torch.is_grad_enabled()):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = _additive_causal_mask(t, past, q.dtype, q.device)
    outputs = []
    for start in range(0, t, _QUERY_BLOCK):
        end = min(t, start + _QUERY_BLOCK)
        visible = past + end
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end], k[:, :, :visible], v[:, :, :visible], attn_mask=mask[start:end, :visible]
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a GELU MLP, both residual."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model)
        self.attn_out = Linear(cfg.d_model, cfg.d_model)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp_in = Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.mlp_out = Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
        ragged: Sequence[Ragged] | None = None,
    ) -> torch.Tensor:
        """`x` is `[B, T, d]`, or with `ragged` the rows of its parts one after another (each
        `[prefix + N, d]`): every row-wise layer then sees only those rows, and attention each
        part's prefix and the padded grids after it."""
        qkv = self.qkv(self.attn_norm(x))
        att = self._attend(qkv, cache, layer) if ragged is None else self._attend_ragged(qkv, ragged)
        x = x + self.attn_out(att)
        # GELU is elementwise (no accumulation): float32 is exact enough and row-invariant.
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x)).float()).to(x.dtype))

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[B, T, 3d]` -> queries, keys and values `[B, heads, T, head_dim]` each."""
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    @staticmethod
    def _attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """Causal attention accumulated wide (keys and values are kept in the model's dtype), output
        rounded once: `[B, T, d]`."""
        acc = _acc_dtype()
        b, _, t, _ = q.shape
        out = _causal_attention(q.to(acc), k.to(acc), v.to(acc), past).to(dtype)
        return out.transpose(1, 2).reshape(b, t, -1)

    def _attend(self, qkv: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        q, k, v = self._heads(qkv)
        past = 0
        if cache is not None:
            cached = cache.keys[layer]
            past = 0 if cached is None else int(cached.shape[2])
            k, v = cache.append(layer, k, v)
        return self._attention(q, k, v, past, qkv.dtype)

    def _attend_ragged(self, qkv: torch.Tensor, parts: Sequence[Ragged]) -> torch.Tensor:
        """`_attention` of every row of `parts`: widened once, rounded once, whatever the buckets."""
        wide = qkv.to(_acc_dtype())
        out = wide.new_empty(wide.shape[0], self.n_heads * self.head_dim)
        start = 0
        for ragged in parts:
            end = start + ragged.rows
            self._attend_part(wide[start:end], ragged, out[start:end])
            start = end
        return out.to(qkv.dtype)

    def _attend_part(self, wide: torch.Tensor, ragged: Ragged, out: torch.Tensor) -> None:
        """Attention of one part's rows `wide` (its prefix, then its sequences' rows), into `out`."""
        p = ragged.prefix
        rows = wide[p:]
        if p:
            hq, hk, hv = self._heads(wide[:p].unsqueeze(0))
            out[:p] = _causal_attention(hq, hk, hv, 0)[0].transpose(0, 1).reshape(p, -1)
        tail = out[p:]
        for bucket in ragged.buckets:
            b, t = bucket.batch, bucket.time
            grid = wide.new_zeros(b * t, wide.shape[-1]).index_copy_(
                0, bucket.grid, rows.index_select(0, bucket.flat)
            )
            q, k, v = self._heads(grid.view(b, t, -1))
            if p:
                k = torch.cat([hk.expand(b, -1, -1, -1), k], dim=2)
                v = torch.cat([hv.expand(b, -1, -1, -1), v], dim=2)
            att = _causal_attention(q, k, v, p).transpose(1, 2).reshape(b * t, -1)
            tail.index_copy_(0, bucket.flat, att.index_select(0, bucket.grid))


class TinyGPT(CausalLM):
    """GPT-style causal LM: token + learned position embeddings, pre-norm blocks, final RMS norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = Linear(config.d_model, config.vocab_size)
        self.apply(self._init_weights)
        # GPT-2 style: scale the residual projections down with depth.
        for block in self.blocks:
            assert isinstance(block, Block)
            for proj in (block.attn_out, block.mlp_out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights (and of every activation)."""
        return self.tok_emb.weight.dtype

    @property
    def max_seq_len(self) -> int:
        return self.config.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.d_model

    def _embed(self, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, time], got shape {tuple(input_ids.shape)}")
        t = input_ids.shape[1]
        if start + t > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {start + t} tokens exceeds max_seq_len={self.config.max_seq_len}; "
                "shorten the prompt or completion"
            )
        pos = torch.arange(start, start + t, device=input_ids.device)
        return self.tok_emb(input_ids) + self.pos_emb(pos)

    def _run(
        self, x: torch.Tensor, cache: KVCache | None, outputs_from: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        hidden = self.final_norm(x[:, outputs_from:])
        return self.lm_head(hidden), hidden

    def forward_with_hidden(
        self, input_ids: torch.Tensor, outputs_from: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `(logits [B, T', V], final_hidden [B, T', d_model])` for a full causal pass.

        The outputs cover positions `outputs_from..T-1` (`T' = T - outputs_from`): a verifier
        needs them only for the completion, and skips the head on the prompt's rows.
        """
        if not 0 <= outputs_from < input_ids.shape[-1]:
            raise ValueError(f"outputs_from={outputs_from} must be in [0, {input_ids.shape[-1]})")
        return self._run(self._embed(input_ids, 0), None, outputs_from)

    def prefill_cache(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
        """Run the prompt once and return `(logits, final_hidden, cache)` for further decoding."""
        cache = KVCache(self.config.n_layers)
        logits, hidden = self._run(self._embed(input_ids, 0), cache)
        return logits, hidden, cache

    def forward_shared_prefixes(
        self, parts: Sequence[SharedPrefixPart]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`forward_shared_prefix` on each `(prefix_ids, input_ids, lengths)` of `parts`, all in one pass:
        the row-wise layers take every part's rows at once, attention keeps each part to itself."""
        chunks, layouts, outputs = [], [], []
        start = 0
        for prefix_ids, input_ids, lengths in parts:
            b, t, p = part_shape(prefix_ids, input_ids, lengths)
            rows = torch.tensor(
                [row * t + c for row, n in enumerate(lengths) for c in range(n)], dtype=torch.long
            )
            chunks.append(self._embed(prefix_ids.unsqueeze(0), 0)[0])
            chunks.append(self._embed(input_ids, p).reshape(b * t, -1).index_select(0, rows))
            layouts.append(plan(p, lengths))
            outputs.append(torch.arange(start + p, start + p + len(rows)))
            start += p + len(rows)
        x = torch.cat(chunks)
        for block in self.blocks:
            x = block(x, None, 0, layouts)
        hidden = self.final_norm(x.index_select(0, torch.cat(outputs)))
        logits = self.lm_head(hidden)
        sizes = [len(rows) for rows in outputs]
        return list(zip(logits.split(sizes), hidden.split(sizes), strict=True))

    def decode_step(self, input_ids: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the next token(s) `[B, t]` after the cached positions; return `(logits, final_hidden)`."""
        return self._run(self._embed(input_ids, cache.length), cache)
