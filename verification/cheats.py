"""Honest and cheating inference workers for calibration: what `hivenet calibrate` measures a policy on.

`RolloutFactory` generates rollout claims for one model, claimed precision and device the way a
worker does (one prompt, a group of assigned seeds decoded together with the key/value cache,
proofs built on the fly), honestly (`honest`) or with one cheat of `CHEAT_CLASSES` (`cheat`):

* `precision_<dtype>`: generated in another precision than the claimed one;
* `int8_weights`, `int4_weights`: weights quantized per output row (symmetric, round to nearest);
* `noisy_weights_1pct`: every weight times (1 + 0.01 N(0, 1));
* `older_1_step`, `older_2_steps`: the weights one or two GRPO steps away (the version lie: the
  figures see the distance between two checkpoints of a run, which steps forward from the
  claimed weights give just as well as steps back);
* `other_model`: another model of the same architecture: every weight tensor's values permuted
  (the same shapes and weight statistics, another function);
* `prompt_token_changed`: one token of the assigned prompt changed, the assigned prompt claimed;
* `greedy`: the most likely token instead of the seeded sampler's;
* `other_temperature`, `other_top_p`: sampled at 0.7 times the run's temperature, or with a
  nucleus of 0.8 times its top-p;
* `last_chunk_swapped`: up to four tokens of the last 32-token chunk replaced, the seeded sampler
  continuing after them, so that every proof is the honest one of the altered completion;
* `tail_altered`: the tokens after the last full chunk replaced, the proofs left as generated;
* `near_tie`: the runner-up token wherever it is within the near-tie tolerance of the seeded
  choice (the most a worker can steer without leaving the honest noise band).

A cheat that leaves a rollout as the honest one (no near tie, no tail, or greedy decoding where
the seeded choice is the most likely token anyway) yields None for it: that rollout is honest.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from protocol.toploc import CHUNK_TOKENS
from training.causal_lm import CausalLM
from training.generation import Choice, Generation, generate_group
from training.grpo import GRPOConfig, GRPOLearner, ScoredRollout
from training.sampling import SamplingParams, mass_before, seeded_scores
from verification.rollout import CLAIM_DTYPES, RolloutClaim

__all__ = ["CHEAT_CLASSES", "Assignment", "RolloutFactory", "cheat_classes"]

_WEIGHT_CHEATS = (
    "int8_weights",
    "int4_weights",
    "noisy_weights_1pct",
    "older_1_step",
    "older_2_steps",
    "other_model",
)
_SAMPLING_CHEATS = (
    "greedy",
    "other_temperature",
    "other_top_p",
    "last_chunk_swapped",
    "tail_altered",
    "near_tie",
)
CHEAT_CLASSES: tuple[str, ...] = (
    "precision_float32",
    "precision_bfloat16",
    "precision_float16",
    *_WEIGHT_CHEATS,
    "prompt_token_changed",
    *_SAMPLING_CHEATS,
)
"""Every cheat class (`cheat_classes(dtype)` leaves out the precision the claim names)."""

_SWAPS_IN_LAST_CHUNK = 4


def cheat_classes(claimed_dtype: str) -> tuple[str, ...]:
    """The cheat classes that are cheats for a claim of `claimed_dtype`."""
    return tuple(c for c in CHEAT_CLASSES if c != f"precision_{claimed_dtype}")


@dataclass(frozen=True)
class Assignment:
    """What a worker is told to generate: one prompt, one seed per completion, a length limit."""

    prompt: list[int]
    seeds: list[int]
    max_new_tokens: int


@dataclass
class RolloutFactory:
    """Builds honest and cheating rollout claims of one (model, claimed precision, device)."""

    model: CausalLM
    """The claimed policy (its master copy; cast per precision as needed)."""
    dtype: str
    """The claimed precision."""
    device: torch.device
    sampling: SamplingParams
    stop_ids: frozenset[int] = frozenset()
    near_tie_rel_tol: float = 0.0
    """The near-tie tolerance (relative to the row's largest |logit|) the `near_tie` cheat exploits."""
    grpo_batch: Callable[[], Sequence[Sequence[ScoredRollout]]] | None = None
    """Scored groups (policy version 0: the claimed weights) for each GRPO step of `older_*` (required
    for those classes)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    seed: int = 0
    _models: dict[str, CausalLM] = field(default_factory=dict, repr=False)

    @property
    def device_class(self) -> str:
        return self.device.type

    # ---- models -------------------------------------------------------------------------

    def model_in(self, variant: str, dtype: str) -> CausalLM:
        """The claimed model (`variant="policy"`) or a cheat's weights, in `dtype` on the device (cached)."""
        key = f"{variant}/{dtype}"
        if key not in self._models:
            self._models[key] = (
                self._variant(variant).to(device=self.device, dtype=CLAIM_DTYPES[dtype]).eval()
            )
        return self._models[key]

    def _variant(self, variant: str) -> CausalLM:
        model = copy.deepcopy(self.model).float().cpu()
        gen = torch.Generator().manual_seed(self.seed + 7919)
        with torch.no_grad():
            if variant == "policy":
                pass
            elif variant in ("int8_weights", "int4_weights"):
                levels = 127 if variant == "int8_weights" else 7
                for p in model.parameters():
                    if p.dim() >= 2:
                        scale = p.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / levels
                        p.copy_((p / scale).round().clamp(-levels, levels) * scale)
            elif variant == "noisy_weights_1pct":
                for p in model.parameters():
                    p.mul_(1.0 + 0.01 * torch.randn(p.shape, generator=gen))
            elif variant == "other_model":
                for p in model.parameters():
                    flat = p.view(-1)
                    flat.copy_(flat[torch.randperm(flat.numel(), generator=gen)])
            elif variant in ("older_1_step", "older_2_steps"):
                model = self._grpo_steps(model, 1 if variant == "older_1_step" else 2)
            else:
                raise ValueError(f"unknown model variant {variant!r}")
        return model

    def _grpo_steps(self, model: CausalLM, steps: int) -> CausalLM:
        if self.grpo_batch is None:
            raise ValueError("the older_* cheats need scored groups for their GRPO steps (grpo_batch)")
        with torch.enable_grad():
            learner = GRPOLearner(model.train(), self.grpo)
            for _ in range(steps):
                groups = self.grpo_batch()
                learner.step(groups)
        return model.eval()

    # ---- generation ---------------------------------------------------------------------

    def _generate(
        self,
        model: CausalLM,
        prompt: Sequence[int],
        a: Assignment,
        params: SamplingParams | None = None,
        choose: Choice | None = None,
    ) -> list[Generation]:
        return generate_group(
            model,
            prompt,
            a.max_new_tokens,
            params or self.sampling,
            a.seeds,
            stop_ids=self.stop_ids,
            choose=choose,
        )

    def _claim(self, a: Assignment, seed: int, completion: list[int], proofs: list[bytes]) -> RolloutClaim:
        return RolloutClaim(
            prompt_ids=list(a.prompt),
            completion_ids=completion,
            policy_version=0,
            sampling=self.sampling,
            seed=seed,
            dtype=self.dtype,  # type: ignore[arg-type]
            device=self.device_class,  # type: ignore[arg-type]
            proofs=proofs,
        )

    def honest(self, a: Assignment) -> list[tuple[RolloutClaim, Generation]]:
        """Honest rollouts of `a`, each with its generation (the worker's logits, for the noise figures)."""
        outs = self._generate(self.model_in("policy", self.dtype), a.prompt, a)
        return [
            (self._claim(a, seed, out.completion_ids, out.proofs), out)
            for seed, out in zip(a.seeds, outs, strict=True)
        ]

    def cheat(self, kind: str, a: Assignment) -> list[RolloutClaim | None]:
        """The claims a worker of cheat class `kind` submits for `a`: None where the claim is the honest
        one (same tokens and proofs: the cheat changed nothing there, as greedy decoding does where the
        seeded choice is the most likely token anyway)."""
        honest = [claim for claim, _ in self.honest(a)]
        return [
            None if c is None or (c.completion_ids, c.proofs) == (h.completion_ids, h.proofs) else c
            for c, h in zip(self._cheat(kind, a), honest, strict=True)
        ]

    def _cheat(self, kind: str, a: Assignment) -> list[RolloutClaim | None]:
        rng = random.Random(f"{self.seed}/{kind}/{a.seeds[0]}")
        policy = self.model_in("policy", self.dtype)
        prompt, params, choose, model = list(a.prompt), None, None, policy
        if kind.startswith("precision_"):
            model = self.model_in("policy", kind.removeprefix("precision_"))
        elif kind in _WEIGHT_CHEATS:
            model = self.model_in(kind, self.dtype)
        elif kind == "prompt_token_changed":
            i = rng.randrange(len(prompt))
            prompt[i] = (prompt[i] + rng.randrange(1, policy.vocab_size)) % policy.vocab_size
        elif kind == "greedy":
            choose = _greedy
        elif kind == "other_temperature":
            params = self.sampling.model_copy(update={"temperature": 0.7 * self.sampling.temperature})
        elif kind == "other_top_p":
            params = self.sampling.model_copy(update={"top_p": 0.8 * self.sampling.top_p})
        elif kind == "near_tie":
            return self._near_tie(policy, a)
        elif kind == "last_chunk_swapped":
            return self._last_chunk_swapped(policy, a, rng)
        elif kind == "tail_altered":
            return self._tail_altered(policy, a, rng)
        else:
            raise ValueError(f"unknown cheat class {kind!r}; known: {', '.join(CHEAT_CLASSES)}")
        outs = self._generate(model, prompt, a, params, choose)
        return [
            self._claim(a, seed, out.completion_ids, out.proofs)
            for seed, out in zip(a.seeds, outs, strict=True)
        ]

    def _near_tie(self, policy: CausalLM, a: Assignment) -> list[RolloutClaim | None]:
        altered: set[int] = set()

        def runner_up(row: int, i: int, logits: torch.Tensor, sampled: int) -> int:
            scores = seeded_scores(logits.unsqueeze(0), self.sampling.temperature, a.seeds[row], [i])[0]
            if self.sampling.top_p < 1.0:
                eligible = (
                    mass_before(logits.unsqueeze(0), self.sampling.temperature)[0] < self.sampling.top_p
                )
                scores = scores.masked_fill(~eligible, float("-inf"))
            top = scores.topk(2)
            tol = self.near_tie_rel_tol * float(logits.double().abs().max())
            if (top.values[0] - top.values[1]) * self.sampling.temperature <= tol:
                altered.add(row)
                return int(top.indices[1])
            return sampled

        outs = self._generate(policy, a.prompt, a, choose=runner_up)
        return [
            self._claim(a, seed, out.completion_ids, out.proofs) if row in altered else None
            for row, (seed, out) in enumerate(zip(a.seeds, outs, strict=True))
        ]

    def _last_chunk_swapped(
        self, policy: CausalLM, a: Assignment, rng: random.Random
    ) -> list[RolloutClaim | None]:
        """Tokens of the last chunk replaced and the rest sampled honestly around them: decoding goes on
        from each replaced token, so the proofs are the honest ones of the altered completion."""
        swaps: list[dict[int, int]] = []
        for out in self._generate(policy, a.prompt, a):
            n = len(out.completion_ids)
            start = CHUNK_TOKENS * ((n - 1) // CHUNK_TOKENS)
            at = rng.sample(range(start, n), min(_SWAPS_IN_LAST_CHUNK, n - start))
            swaps.append({i: rng.randrange(1, policy.vocab_size) for i in at})

        def swapped(row: int, i: int, _logits: torch.Tensor, sampled: int) -> int:
            shift = swaps[row].get(i)
            return sampled if shift is None else (sampled + shift) % policy.vocab_size

        outs = self._generate(policy, a.prompt, a, choose=swapped)
        return [
            self._claim(a, seed, out.completion_ids, out.proofs)
            for seed, out in zip(a.seeds, outs, strict=True)
        ]

    def _tail_altered(self, policy: CausalLM, a: Assignment, rng: random.Random) -> list[RolloutClaim | None]:
        claims: list[RolloutClaim | None] = []
        for seed, out in zip(a.seeds, self._generate(policy, a.prompt, a), strict=True):
            n = len(out.completion_ids)
            start = CHUNK_TOKENS * (n // CHUNK_TOKENS)
            if start == n:
                claims.append(None)  # no tail after the last full chunk: nothing to alter
                continue
            completion = list(out.completion_ids)
            for i in range(start, n):
                completion[i] = (completion[i] + rng.randrange(1, policy.vocab_size)) % policy.vocab_size
            claims.append(self._claim(a, seed, completion, out.proofs))
        return claims


def _greedy(_row: int, _i: int, logits: torch.Tensor, _sampled: int) -> int:
    return int(logits.argmax())
