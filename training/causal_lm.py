"""The one model interface every consumer uses: training, GRPO, generation, verification, checkpoints.

`CausalLM` is an `nn.Module` with the passes the network needs, whatever computes them:

* `forward_with_hidden(ids, outputs_from)`: one causal pass over `[B, T]`, returning the logits and
  the *final hidden state* (the output of the final norm, just before the LM head: what TOPLOC
  proves) of positions `outputs_from..T-1` (training, GRPO's log-probs, the verifier's prefill);
* `prefill_cache(ids)` then `decode_step(token, cache)`: incremental decoding with a key/value
  cache (generation), returning the same pair for every new position;
* `forward_shared_prefixes(parts)`: several groups of completions, each after its own shared
  prompt, in one call (the validator's pass over a batch of groups);
* `loss(inputs, targets)`: next-token cross-entropy, computed in float32.

Backends: `training.model.TinyGPT` (`tiny`) and `training.hf_model.HFCausalLM` (`hf`). Weights are
the module's `state_dict`; `weights_hash` names them by content.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CausalLM", "SharedPrefixPart", "part_shape", "weights_hash"]

SharedPrefixPart = tuple[torch.Tensor, torch.Tensor, Sequence[int]]
"""`(prefix_ids [P], input_ids [B, t] right-padded, lengths)`: B continuations of one prompt."""


def part_shape(
    prefix_ids: torch.Tensor, input_ids: torch.Tensor, lengths: Sequence[int]
) -> tuple[int, int, int]:
    """`(continuations, padded width, prefix length)` of a shared-prefix part; ValueError if it is inconsistent."""
    b, t = input_ids.shape
    if prefix_ids.dim() != 1 or len(lengths) != b or not all(0 <= n <= t for n in lengths):
        raise ValueError(
            f"lengths {list(lengths)} do not fit input_ids of shape {(b, t)} after a prefix of shape "
            f"{tuple(prefix_ids.shape)}"
        )
    return b, t, prefix_ids.shape[0]


class CausalLM(nn.Module, abc.ABC):
    """A causal language model as the network uses it (see the module docstring)."""

    @property
    @abc.abstractmethod
    def max_seq_len(self) -> int:
        """Longest sequence (prompt + completion) in tokens."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (rows of the logits)."""

    @property
    @abc.abstractmethod
    def hidden_size(self) -> int:
        """Width of the final hidden state."""

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights (the first floating parameter's)."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return next(self.parameters()).device

    @abc.abstractmethod
    def forward_with_hidden(
        self, input_ids: torch.Tensor, outputs_from: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(logits [B, T', V], final_hidden [B, T', d])` for positions `outputs_from..T-1`."""

    @abc.abstractmethod
    def prefill_cache(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Run the prompt once; return `(logits, final_hidden, cache)` for `decode_step`."""

    @abc.abstractmethod
    def decode_step(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the next token(s) `[B, t]` after the cached positions; return `(logits, final_hidden)`."""

    @abc.abstractmethod
    def forward_shared_prefixes(
        self, parts: Sequence[SharedPrefixPart]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each part, `(logits [N, V], final_hidden [N, d])` of its `N = sum(lengths)` real
        continuation tokens, the rows of continuation 0 first."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits `[B, T, V]` for `input_ids` `[B, T]`."""
        return self.forward_with_hidden(input_ids)[0]

    def forward_shared_prefix(
        self, prefix_ids: torch.Tensor, input_ids: torch.Tensor, lengths: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward_shared_prefixes` for one part."""
        return self.forward_shared_prefixes([(prefix_ids, input_ids, lengths)])[0]

    def loss(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `targets [B, T]` under the logits for `input_ids [B, T]` (float32).

        For next-token training pass `input_ids = seq[:, :-1]`, `targets = seq[:, 1:]`.
        Target positions equal to -100 are ignored.
        """
        logits = self.forward(input_ids)
        return F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
        )

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())


def weights_hash(state: Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 of a state dict's names, dtypes, shapes and bytes, in name order.

    Two models hash alike exactly when they hold the same tensors under the same names, whatever
    file or device they came from: this is the "content hash of the starting weights" a run names.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        header = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{tuple(tensor.shape)}\0"
        digest.update(header.encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
