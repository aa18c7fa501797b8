"""The rollout verdict: accept a worker's rollout, or reject it with the reason and the figures.

One prefill of `prompt + completion` in the claimed precision recomputes the final hidden
states and logits at every completion position (see `training.generation` for which rows
are proved). Then, in order, the first failing check decides:

1. the claim itself: a precision and device class the run allows (their limits are the
   `VerificationPolicy` the rest applies), token ids inside the vocabulary, length within the
   model, the expected policy version, the assigned prompt and seed (when the caller knows them);
2. the proofs are well formed (`InvalidProofError` becomes a `malformed_proof` rejection);
3. TOPLOC, per 32-token chunk, against the policy's limits;
4. seeded sampling: every completion token must be the seeded sampler's choice on the
   recomputed logits, or lose to it by no more than the policy's near-tie tolerance, and the
   rollout may have no more such near-tie deviations than the policy allows.

`judge` is the pure part (claim + recomputed tensors -> verdict); `verify_rollout` adds the
prefill, and `RolloutVerifier` keeps one model copy per precision for a policy version.
`RolloutVerifier.verify_group` judges a group's claims with one batched pass per precision
(`verification.recompute.recompute_batch`: the shared prompt once, the completions as a batch),
which recomputes the very rows of one prefill per claim (`recompute`); `verify_groups` does the
same for several groups at once.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.errors import InvalidProofError
from protocol.toploc import CHUNK_TOKENS, TOPK, ChunkCheck, verify_proofs_batch
from protocol.verification_policy import RunVerification, VerificationPolicy, default_run_verification
from training.causal_lm import CausalLM
from verification.recompute import recompute, recompute_batch
from verification.rollout import CLAIM_DTYPES, RolloutClaim
from verification.sampling_check import SamplingCheck, check_sampling, check_sampling_batch

__all__ = [
    "GroupClaims",
    "RejectReason",
    "RolloutVerifier",
    "Verdict",
    "backend_verification",
    "decide",
    "judge",
    "recompute",
    "recompute_batch",
    "summarize",
    "verify_rollout",
]


class RejectReason(enum.StrEnum):
    """Why a rollout was rejected (stable strings, suitable for wire codes and metrics)."""

    MALFORMED_CLAIM = "malformed_claim"
    """Token ids outside the vocabulary, too long for the model, or an unsupported precision."""
    PRECISION_NOT_ALLOWED = "precision_not_allowed"
    """The claimed precision is not one the run's verification policy allows."""
    DEVICE_NOT_ALLOWED = "device_not_allowed"
    """The run allows the claimed precision, but not on the claimed device class."""
    POLICY_VERSION = "policy_version"
    """The claim names another policy version than the one the verifier holds."""
    PROMPT_MISMATCH = "prompt_mismatch"
    """The claimed prompt is not the prompt assigned to the worker."""
    SEED_MISMATCH = "seed_mismatch"
    """The claimed sampling seed is not the seed assigned to the worker."""
    MALFORMED_PROOF = "malformed_proof"
    """A proof has a wrong length, modulus or coefficient, or there is not one per chunk."""
    TOPLOC_EXPONENT = "toploc_exponent"
    """Too many exponent mismatches in a chunk: other activations (model, prompt, tokens)."""
    TOPLOC_SIGN = "toploc_sign"
    """Too many sign mismatches in a chunk."""
    TOPLOC_MANTISSA = "toploc_mantissa"
    """Mantissa error (mean or median) too large in a chunk: other weights or precision."""
    TOPLOC_VALUES = "toploc_values"
    """Too many committed values differ at all in a chunk: other precision or kernels."""
    SAMPLING = "sampling"
    """A token is not the one the seeded sampler picks from the recomputed logits, beyond a near tie."""
    SAMPLING_NEAR_TIES = "sampling_near_ties"
    """More tokens differ from the seeded choice at near ties than honest logit noise flips."""


@dataclass(frozen=True)
class Verdict:
    """`accepted`, or rejected with a reason, the failing chunk/token and the figures behind it."""

    accepted: bool
    reason: RejectReason | None = None
    detail: str = ""
    failing_chunk: int | None = None
    """Index of the 32-token chunk that failed (TOPLOC or sampling), if any."""
    failing_position: int | None = None
    """Completion index of the first token that failed the sampling check, if any."""
    chunks: tuple[ChunkCheck, ...] = ()
    """TOPLOC figures per chunk (empty if verification stopped before TOPLOC)."""
    sampling: SamplingCheck | None = field(default=None, repr=False)
    """Per-token sampling gaps (None if verification stopped before the sampling check)."""

    def __str__(self) -> str:
        if self.accepted:
            return "accepted"
        where = f", chunk {self.failing_chunk}" if self.failing_chunk is not None else ""
        return f"rejected({self.reason}{where}: {self.detail})"


@dataclass(frozen=True)
class GroupClaims:
    """Claims judged together (`RolloutVerifier.verify_groups`), with what their assignment fixed."""

    claims: Sequence[RolloutClaim]
    assigned_prompt_ids: Sequence[int] | None = None
    assigned_seeds: Sequence[int] | None = None
    """Claim i's assigned seed is `assigned_seeds[i]`."""


def _reject(reason: RejectReason, detail: str, **figures: object) -> Verdict:
    return Verdict(accepted=False, reason=reason, detail=detail, **figures)  # type: ignore[arg-type]


def _check_chunk(c: ChunkCheck, policy: VerificationPolicy) -> tuple[RejectReason, str] | None:
    if c.exp_mismatches > policy.max_exp_mismatches:
        return RejectReason.TOPLOC_EXPONENT, (
            f"{c.exp_mismatches}/{c.topk} exponent mismatches > {policy.max_exp_mismatches}"
        )
    if c.sign_mismatches > policy.max_sign_mismatches:
        return (
            RejectReason.TOPLOC_SIGN,
            f"{c.sign_mismatches}/{c.topk} sign mismatches > {policy.max_sign_mismatches}",
        )
    if c.mant_err_mean > policy.max_mant_err_mean or c.mant_err_median > policy.max_mant_err_median:
        return RejectReason.TOPLOC_MANTISSA, (
            f"mantissa error mean {c.mant_err_mean:.3f} (max {policy.max_mant_err_mean}), "
            f"median {c.mant_err_median:.0f} (max {policy.max_mant_err_median})"
        )
    if c.value_mismatches > policy.max_value_mismatches:
        return RejectReason.TOPLOC_VALUES, (
            f"{c.value_mismatches}/{c.topk} committed values differ > {policy.max_value_mismatches}"
        )
    return None


def judge(
    claim: RolloutClaim,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    *,
    policy: VerificationPolicy,
    chunk_tokens: int = CHUNK_TOKENS,
    topk: int = TOPK,
    sampling: SamplingCheck | None = None,
    toploc: list[ChunkCheck] | InvalidProofError | None = None,
) -> Verdict:
    """Verdict on `claim` given the verifier's recomputed completion rows.

    `hidden [C, H]` and `logits [C, V]` are the final hidden states and logits at the
    positions that produced the C completion tokens (`prompt_len - 1 ...`), computed in the
    claimed precision. Proof and TOPLOC checks come first, then the sampling check.
    `toploc` and `sampling`, when given, are those checks already computed on these rows
    (`verify_proofs_batch`, `check_sampling_batch`).
    """
    n = len(claim.completion_ids)
    if hidden.shape[0] != n or logits.shape[0] != n:
        raise ValueError(
            f"need {n} recomputed rows, got hidden {tuple(hidden.shape)}, logits {tuple(logits.shape)}"
        )
    if toploc is None:
        toploc = verify_proofs_batch([(hidden.to(torch.bfloat16), list(claim.proofs))], chunk_tokens, topk)[0]
    if isinstance(toploc, InvalidProofError):
        return _reject(RejectReason.MALFORMED_PROOF, str(toploc))
    if sampling is None:
        sampling = check_sampling(
            logits,
            torch.tensor(claim.completion_ids),
            claim.sampling,
            claim.seed,
            abs_tol=policy.sampling_abs_tol,
            rel_tol=policy.sampling_rel_tol,
        )
    return decide(claim, toploc, sampling, policy=policy, chunk_tokens=chunk_tokens)


def decide(
    claim: RolloutClaim,
    toploc: Sequence[ChunkCheck],
    sampling: SamplingCheck,
    *,
    policy: VerificationPolicy,
    chunk_tokens: int = CHUNK_TOKENS,
) -> Verdict:
    """The verdict `judge` reaches from a claim's TOPLOC figures and sampling check, against `policy`'s limits."""
    n = len(claim.completion_ids)
    chunks = tuple(toploc)
    for i, c in enumerate(chunks):
        failure = _check_chunk(c, policy)
        if failure is not None:
            return _reject(failure[0], failure[1], failing_chunk=i, chunks=chunks)
    failing = sampling.failing
    if failing.size:
        pos = int(failing[0])
        return _reject(
            RejectReason.SAMPLING,
            f"token {pos} ({claim.completion_ids[pos]}) is {sampling.gaps[pos]:.4f} logits below the seeded "
            f"sampler's choice (tolerance {sampling.tolerances[pos]:.4f}); {failing.size} token(s) fail",
            failing_chunk=pos // chunk_tokens,
            failing_position=pos,
            chunks=chunks,
            sampling=sampling,
        )
    allowance = policy.near_tie_allowance(n)
    if sampling.deviations > allowance:
        pos = int(np.nonzero(sampling.gaps > 0.0)[0][0])
        return _reject(
            RejectReason.SAMPLING_NEAR_TIES,
            f"{sampling.deviations} of {n} tokens are not the seeded sampler's choice (each within a near "
            f"tie); honest noise flips at most {allowance}",
            failing_chunk=pos // chunk_tokens,
            failing_position=pos,
            chunks=chunks,
            sampling=sampling,
        )
    return Verdict(accepted=True, detail="all checks passed", chunks=chunks, sampling=sampling)


def _check_claim(
    claim: RolloutClaim,
    model: CausalLM,
    expected_policy_version: int | None,
    assigned_prompt_ids: Sequence[int] | None,
    assigned_seed: int | None,
) -> Verdict | None:
    if expected_policy_version is not None and claim.policy_version != expected_policy_version:
        return _reject(
            RejectReason.POLICY_VERSION,
            f"claim is for policy version {claim.policy_version}, verifier holds {expected_policy_version}",
        )
    if assigned_prompt_ids is not None and list(claim.prompt_ids) != list(assigned_prompt_ids):
        return _reject(RejectReason.PROMPT_MISMATCH, "claimed prompt differs from the assigned prompt")
    if assigned_seed is not None and claim.seed != assigned_seed:
        return _reject(RejectReason.SEED_MISMATCH, f"claimed seed {claim.seed} is not the assigned seed")
    if claim.dtype not in CLAIM_DTYPES:
        return _reject(RejectReason.MALFORMED_CLAIM, f"unsupported precision {claim.dtype!r}")
    top = max(max(claim.prompt_ids), max(claim.completion_ids))
    if top >= model.vocab_size:
        return _reject(
            RejectReason.MALFORMED_CLAIM, f"token id {top} outside the vocabulary of {model.vocab_size}"
        )
    positions = len(claim.prompt_ids) + len(claim.completion_ids) - 1
    if positions > model.max_seq_len:
        return _reject(
            RejectReason.MALFORMED_CLAIM,
            f"prompt + completion need {positions} positions, the model has {model.max_seq_len}",
        )
    return None


def verify_rollout(
    claim: RolloutClaim,
    model: CausalLM,
    *,
    expected_policy_version: int | None = None,
    assigned_prompt_ids: Sequence[int] | None = None,
    assigned_seed: int | None = None,
    policy: VerificationPolicy,
) -> Verdict:
    """Verify `claim` against `model` (which must already be in the claimed precision).

    `expected_policy_version`, `assigned_prompt_ids` and `assigned_seed`, when given, must
    match the claim. Never raises on hostile claims: every failure is a rejected `Verdict`.
    """
    bad = _check_claim(claim, model, expected_policy_version, assigned_prompt_ids, assigned_seed)
    if bad is not None:
        return bad
    if model.dtype != CLAIM_DTYPES[claim.dtype]:
        raise ValueError(
            f"model is in {model.dtype} but the claim is {claim.dtype}; use RolloutVerifier, which "
            "keeps a copy per precision"
        )
    hidden, logits = recompute(claim, model)
    return judge(claim, hidden, logits, policy=policy)


def _not_allowed(claim: RolloutClaim, verification: RunVerification) -> Verdict:
    if not verification.allows_dtype(claim.dtype):
        reason = RejectReason.PRECISION_NOT_ALLOWED
    else:
        reason = RejectReason.DEVICE_NOT_ALLOWED
    return _reject(
        reason,
        f"the run does not allow {claim.dtype} on {claim.device} (it allows {verification.allowed()})",
    )


def backend_verification(model: CausalLM) -> RunVerification:
    """The built-in policy for `model`'s backend: exact for `TinyGPT`, the paper's fallback otherwise."""
    from training.model import TinyGPT

    return default_run_verification("tiny" if isinstance(model, TinyGPT) else "hf")


class RolloutVerifier:
    """Verifies rollouts for one policy version, keeping one model copy per claimed precision.

    `verification` is the run's policy (default: the built-in one of the model's backend); each claim
    is judged by the limits of its (precision, device class), and a pair the run does not allow is
    rejected before any prefill.
    """

    def __init__(
        self, model: CausalLM, policy_version: int, verification: RunVerification | None = None
    ) -> None:
        self.policy_version = policy_version
        self.verification = verification or backend_verification(model)
        self._master = model
        self._copies: dict[torch.dtype, CausalLM] = {model.dtype: model}

    def model_for(self, dtype: torch.dtype) -> CausalLM:
        """The policy model in `dtype` (cast once from the master copy, then cached)."""
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self._master).to(dtype).eval()
        return self._copies[dtype]

    def verify(
        self,
        claim: RolloutClaim,
        *,
        assigned_prompt_ids: Sequence[int] | None = None,
        assigned_seed: int | None = None,
    ) -> Verdict:
        """Verdict on `claim`; see `verify_rollout`."""
        if claim.dtype not in CLAIM_DTYPES:
            return _reject(RejectReason.MALFORMED_CLAIM, f"unsupported precision {claim.dtype!r}")
        policy = self.verification.for_claim(claim.dtype, claim.device)
        if policy is None:
            return _not_allowed(claim, self.verification)
        return verify_rollout(
            claim,
            self.model_for(CLAIM_DTYPES[claim.dtype]),
            expected_policy_version=self.policy_version,
            assigned_prompt_ids=assigned_prompt_ids,
            assigned_seed=assigned_seed,
            policy=policy,
        )

    def verify_group(
        self,
        claims: Sequence[RolloutClaim],
        *,
        assigned_prompt_ids: Sequence[int] | None = None,
        assigned_seeds: Sequence[int] | None = None,
    ) -> list[Verdict]:
        """Verdicts on `claims` in order, up to and including the first rejection.

        The same verdicts as `verify` on each claim in turn, stopping at the first rejected
        one (`assigned_seeds[i]` is claim i's seed), but with one batched pass per
        claimed precision (`recompute_batch`), one TOPLOC evaluation (`verify_proofs_batch`)
        and one sampling check per set of sampling parameters (`check_sampling_batch`) for
        the claims before the first that fails the claim checks.
        """
        return self.verify_groups([GroupClaims(claims, assigned_prompt_ids, assigned_seeds)])[0]

    def verify_groups(self, groups: Sequence[GroupClaims]) -> list[list[Verdict]]:
        """`verify_group` on each of `groups`, with every group's claims in the same batched passes.

        One group's claims never change another's verdicts (every figure is computed row by row);
        judging several groups at once only shares the per-call costs of the passes.
        """
        for group in groups:
            if group.assigned_seeds is not None and len(group.assigned_seeds) != len(group.claims):
                raise ValueError(f"{len(group.assigned_seeds)} assigned seeds for {len(group.claims)} claims")
        early: list[list[Verdict | None]] = []
        for group in groups:
            problems: list[Verdict | None] = []
            for i, claim in enumerate(group.claims):
                seed = None if group.assigned_seeds is None else group.assigned_seeds[i]
                problems.append(self._claim_problem(claim, group.assigned_prompt_ids, seed))
                if problems[-1] is not None:
                    break
            early.append(problems)
        prefilled = [
            (g, i) for g, problems in enumerate(early) for i, bad in enumerate(problems) if bad is None
        ]
        claims = {key: groups[key[0]].claims[key[1]] for key in prefilled}
        rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for dtype in dict.fromkeys(claim.dtype for claim in claims.values()):
            same = [key for key in prefilled if claims[key].dtype == dtype]
            batch = recompute_batch([claims[key] for key in same], self.model_for(CLAIM_DTYPES[dtype]))
            rows.update(zip(same, batch, strict=True))
        policies = {key: self._policy(claims[key]) for key in prefilled}
        checks: dict[tuple[int, int], SamplingCheck] = {}
        for params, policy in dict.fromkeys((claims[key].sampling, policies[key]) for key in prefilled):
            same = [key for key in prefilled if (claims[key].sampling, policies[key]) == (params, policy)]
            batch_checks = check_sampling_batch(
                [rows[key][1] for key in same],
                [torch.tensor(claims[key].completion_ids) for key in same],
                params,
                [claims[key].seed for key in same],
                abs_tol=policy.sampling_abs_tol,
                rel_tol=policy.sampling_rel_tol,
            )
            checks.update(zip(same, batch_checks, strict=True))
        proofs = verify_proofs_batch(
            [(rows[key][0].to(torch.bfloat16), list(claims[key].proofs)) for key in prefilled]
        )
        toploc = dict(zip(prefilled, proofs, strict=True))
        results = []
        for g, problems in enumerate(early):
            verdicts = []
            for i, bad in enumerate(problems):
                verdict = bad
                if verdict is None:
                    key = (g, i)
                    verdict = judge(
                        claims[key],
                        *rows[key],
                        policy=policies[key],
                        sampling=checks[key],
                        toploc=toploc[key],
                    )
                verdicts.append(verdict)
                if not verdict.accepted:
                    break
            results.append(verdicts)
        return results

    def _policy(self, claim: RolloutClaim) -> VerificationPolicy:
        policy = self.verification.for_claim(claim.dtype, claim.device)
        assert policy is not None, "claims of pairs the run does not allow are rejected before this"
        return policy

    def _claim_problem(
        self, claim: RolloutClaim, assigned_prompt_ids: Sequence[int] | None, assigned_seed: int | None
    ) -> Verdict | None:
        """The rejection `verify` gives `claim` before any prefill, if any."""
        if claim.dtype not in CLAIM_DTYPES:
            return _reject(RejectReason.MALFORMED_CLAIM, f"unsupported precision {claim.dtype!r}")
        if self.verification.for_claim(claim.dtype, claim.device) is None:
            return _not_allowed(claim, self.verification)
        return _check_claim(claim, self._master, self.policy_version, assigned_prompt_ids, assigned_seed)


def summarize(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """Counts of accepted and of each rejection reason (for reports and metrics)."""
    out: dict[str, int] = {"accepted": 0}
    for v in verdicts:
        key = "accepted" if v.accepted else str(v.reason)
        out[key] = out.get(key, 0) + 1
    return out
