"""Recomputing a rollout's rows: the final hidden states and logits a validator checks a claim against.

`recompute` is one prefill of `prompt + completion`; `recompute_batch` gives the same rows for
several claims in one pass (see its docstring for why they are bit for bit the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from training.causal_lm import CausalLM
from verification.rollout import RolloutClaim

__all__ = ["recompute", "recompute_batch"]


@torch.inference_mode()
def recompute(claim: RolloutClaim, model: CausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefill of `prompt + completion[:-1]`; returns the completion rows `(hidden, logits)`."""
    ids = torch.tensor(
        [list(claim.prompt_ids) + list(claim.completion_ids[:-1])], dtype=torch.long, device=model.device
    )
    model.eval()
    logits, hidden = model.forward_with_hidden(ids, outputs_from=len(claim.prompt_ids) - 1)
    return hidden[0].cpu(), logits[0].cpu()


@torch.inference_mode()
def recompute_batch(
    claims: Sequence[RolloutClaim], model: CausalLM
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`recompute` for several claims at once: the same `(hidden, logits)` rows per claim.

    All claims go through one pass, and claims that answer the same prompt (a group's rollouts
    all answer its one assigned prompt) share their prompt's rows: the prompt is computed once,
    and the completions after it as one right-padded batch whose padding only attention sees
    (`CausalLM.forward_shared_prefixes`).
    Neither the padding nor the sharing changes a real row: under causal attention a position
    sees only the positions before it, and `CausalLM`'s inference path (float64 accumulation,
    one rounding) makes a row's result independent of the other rows computed with it, so
    each claim's rows are bit for bit those of its own prefill. Against one prefill per claim
    this saves the per-call overhead of every layer and the prompt's repeated rows, which
    dominate for short completions.
    """
    if not claims:
        return []
    if model.training:
        model.eval()
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, claim in enumerate(claims):
        by_prompt.setdefault(tuple(claim.prompt_ids), []).append(i)
    parts = []
    for prompt, members in by_prompt.items():
        tails = [[prompt[-1], *claims[i].completion_ids[:-1]] for i in members]
        lengths = [len(tail) for tail in tails]
        width = max(lengths)
        ids = torch.tensor(
            [tail + [0] * (width - len(tail)) for tail in tails], dtype=torch.long, device=model.device
        )
        parts.append((torch.tensor(list(prompt[:-1]), dtype=torch.long, device=model.device), ids, lengths))
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for members, (logits, hidden), (_, _, lengths) in zip(
        by_prompt.values(), model.forward_shared_prefixes(parts), parts, strict=True
    ):
        hidden, logits = hidden.cpu(), logits.cpu()
        rows.update(zip(members, zip(hidden.split(lengths), logits.split(lengths), strict=True), strict=True))
    return [rows[i] for i in range(len(claims))]
