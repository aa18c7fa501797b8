"""The `hf` backend: any `transformers` causal LM behind the `CausalLM` interface, on native kernels.

`HFCausalLM` wraps an `AutoModelForCausalLM` model (Llama, Qwen2/Qwen3, Mistral, GPT-2 and the
other families `transformers` implements itself). Its passes call the model's *base* model (the
decoder stack ending in its final norm), whose `last_hidden_state` is the final hidden state that
TOPLOC proves, then the output embedding (the LM head) on the rows asked for. The key/value cache
is `transformers`' own. `state_dict` is the wrapped model's, under the names its safetensors
files use, so checkpoints, the weight broadcast and `weights_hash` see the usual tensor names.

`load_hf_model` loads a checked directory (`training.model_dir.check_model_dir`) with remote code
off and safetensors only; `hf_model_from_config` builds a model with a seeded random init.
`transformers` is imported only here, when an `hf` model is first used.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from protocol.errors import ModelError
from training.causal_lm import CausalLM, SharedPrefixPart, part_shape
from training.model_dir import check_model_dir
from training.ragged import plan

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["PACKED_TOKENS", "HFCausalLM", "hf_model_from_config", "load_hf_model", "quiet_transformers"]

PACKED_TOKENS = 1024
"""Longest part (prefix plus all its continuations) a shared-prefix pass packs into one row. A packed
row's mask is dense (`[rows, rows]` per part), so past this the bucketed pass costs less."""


def quiet_transformers() -> None:
    """Keep `transformers`' download and loading progress bars off the terminal (hivenet shows its own)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


class HFCausalLM(CausalLM):
    """A `transformers` causal LM as a `CausalLM` (see the module docstring)."""

    def __init__(self, hf: PreTrainedModel, *, packed_tokens: int = PACKED_TOKENS) -> None:
        super().__init__()
        self.hf = hf
        self.packed_tokens = packed_tokens
        """Longest part a shared-prefix pass packs into one row (`PACKED_TOKENS`); 0 packs none."""

    @property
    def family(self) -> str:
        """The architecture's `model_type` ("llama", "qwen2", "gpt2", ...)."""
        return str(self.hf.config.model_type)

    @property
    def max_seq_len(self) -> int:
        config = self.hf.config
        return int(getattr(config, "max_position_embeddings", None) or config.n_positions)

    @property
    def vocab_size(self) -> int:
        return int(self._head().weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.hf.config.hidden_size)

    def _head(self) -> torch.nn.Linear:
        head = self.hf.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise ModelError(f"{type(self.hf).__name__} has no linear LM head; it is not a causal LM")
        return head

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states; in float32 for a half-precision model.

        Sampling and its check compare logits, and a half-precision head rounds each one to a bf16/fp16
        ulp (0.06 at a logit of 10 in bf16): two honest passes whose hidden states agree bit for bit
        then still flip near ties wherever the head's accumulation order differs. Computed in float32
        from the same hidden states, honest logits differ only where the hidden states do.
        """
        head = self._head()
        if hidden.dtype in (torch.bfloat16, torch.float16):
            bias = None if head.bias is None else head.bias.float()
            return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)
        return head(hidden)

    def _check_length(self, length: int) -> None:
        if length > self.max_seq_len:
            raise ValueError(
                f"sequence of {length} tokens exceeds max_seq_len={self.max_seq_len}; "
                "shorten the prompt or completion"
            )

    def forward_with_hidden(
        self, input_ids: torch.Tensor, outputs_from: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, time], got shape {tuple(input_ids.shape)}")
        if not 0 <= outputs_from < input_ids.shape[-1]:
            raise ValueError(f"outputs_from={outputs_from} must be in [0, {input_ids.shape[-1]})")
        self._check_length(input_ids.shape[1])
        out = self.hf.base_model(input_ids=input_ids, use_cache=False)
        hidden = out.last_hidden_state[:, outputs_from:]
        return self._logits(hidden), hidden

    def prefill_cache(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        self._check_length(input_ids.shape[1])
        out = self.hf.base_model(input_ids=input_ids, use_cache=True)
        hidden = out.last_hidden_state
        return self._logits(hidden), hidden, out.past_key_values

    def decode_step(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_length(cache.get_seq_length() + input_ids.shape[1])
        out = self.hf.base_model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        hidden = out.last_hidden_state
        return self._logits(hidden), hidden

    def forward_shared_prefixes(
        self, parts: Sequence[SharedPrefixPart]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The real continuation rows of each part, its prefix computed once.

        Parts up to `packed_tokens` long go through one pass together, each packed into one row of
        the batch (`_packed`); longer ones each get a pass of their own (`_bucketed`).
        """
        shapes = [part_shape(*part) for part in parts]
        for (_, _, p), (_, _, lengths) in zip(shapes, parts, strict=True):
            self._check_length(p + max(lengths, default=0))
        packed_sizes = [p + sum(lengths) for (_, _, p), (_, _, lengths) in zip(shapes, parts, strict=True)]
        short = [i for i, size in enumerate(packed_sizes) if size <= self.packed_tokens]
        results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if short:
            results.update(zip(short, self._packed([parts[i] for i in short]), strict=True))
        for i in range(len(parts)):
            if i not in results:
                results[i] = self._bucketed(parts[i])
        return [results[i] for i in range(len(parts))]

    def _packed(self, parts: Sequence[SharedPrefixPart]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over every part, each packed into one row `[prefix, continuation 1, continuation 2,
        ...]` with positions restarting after the prefix and a mask under which each continuation sees
        the prefix and its own earlier tokens only (padding sees itself)."""
        device = parts[0][1].device
        rows_per_part = [prefix.shape[0] + sum(lengths) for prefix, _, lengths in parts]
        width = max(rows_per_part)
        ids = torch.zeros(len(parts), width, dtype=torch.long, device=device)
        positions = torch.zeros(len(parts), width, dtype=torch.long, device=device)
        allowed = torch.eye(width, dtype=torch.bool, device=device).repeat(len(parts), 1, 1)
        for row, (prefix, input_ids, lengths) in enumerate(parts):
            p = prefix.shape[0]
            ids[row, :p] = prefix
            positions[row, :p] = torch.arange(p, device=device)
            allowed[row, :p, :p] = torch.ones(p, p, dtype=torch.bool, device=device).tril()
            start = p
            for i, n in enumerate(lengths):
                end = start + n
                ids[row, start:end] = input_ids[i, :n]
                positions[row, start:end] = torch.arange(p, p + n, device=device)
                allowed[row, start:end, :p] = True
                allowed[row, start:end, start:end] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
                start = end
        out = self.hf.base_model(input_ids=ids, attention_mask=allowed.unsqueeze(1), position_ids=positions)
        results = []
        for row, ((prefix, _, _), size) in enumerate(zip(parts, rows_per_part, strict=True)):
            hidden = out.last_hidden_state[row, prefix.shape[0] : size]
            results.append((self._logits(hidden), hidden))
        return results

    def _bucketed(self, part: SharedPrefixPart) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix once (its keys and values cached), then the continuations in buckets of similar
        length (`training.ragged.plan`), each right-padded to its longest member and masked so that no
        real position attends to padding."""
        prefix_ids, input_ids, lengths = part
        p = prefix_ids.shape[0]
        device = input_ids.device
        real = torch.cat([input_ids[i, :n] for i, n in enumerate(lengths)])
        rows = torch.empty(real.shape[0], self.hidden_size, dtype=self.dtype, device=device)
        prefix_cache = None
        if p:
            prefix_cache = self.hf.base_model(
                input_ids=prefix_ids.unsqueeze(0), use_cache=True
            ).past_key_values
        for bucket in plan(p, lengths).buckets:
            flat, grid = bucket.flat.to(device), bucket.grid.to(device)
            ids = torch.zeros(bucket.batch * bucket.time, dtype=torch.long, device=device)
            ids[grid] = real[flat]
            mask = torch.zeros(bucket.batch * bucket.time, dtype=torch.long, device=device)
            mask[grid] = 1
            mask = torch.cat(
                [
                    torch.ones(bucket.batch, p, dtype=torch.long, device=device),
                    mask.view(bucket.batch, -1),
                ],
                dim=1,
            )
            cache = None
            if prefix_cache is not None:
                cache = copy.deepcopy(prefix_cache)
                cache.batch_repeat_interleave(bucket.batch)
            out = self.hf.base_model(
                input_ids=ids.view(bucket.batch, bucket.time),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=cache is not None,
            )
            rows[flat] = out.last_hidden_state.reshape(-1, rows.shape[1])[grid]
        return self._logits(rows), rows

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """The wrapped model's state dict (the tensor names of its safetensors files)."""
        return self.hf.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        return self.hf.load_state_dict(state_dict, strict=strict, assign=assign)


def load_hf_model(
    path: Path | str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> HFCausalLM:
    """The model saved in `path` (checked first), in `dtype` on `device`, in eval mode."""
    info = check_model_dir(path)
    from transformers import AutoModelForCausalLM

    try:
        hf = AutoModelForCausalLM.from_pretrained(
            info.path, trust_remote_code=False, use_safetensors=True, local_files_only=True, dtype=dtype
        )
    except Exception as e:  # a damaged file fails deep inside transformers or safetensors, in many kinds
        raise ModelError(f"could not load the model in {info.path}: {e}; check its files are complete") from e
    return HFCausalLM(hf).to(device).eval()


def hf_model_from_config(config: PretrainedConfig, *, seed: int) -> HFCausalLM:
    """A model of `config`'s architecture with the random init `transformers` gives it under `seed`."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return HFCausalLM(hf).eval()
