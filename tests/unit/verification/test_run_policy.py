"""A run's verification policy: limits per (precision, device class), near ties counted, hashed."""

from __future__ import annotations

import pytest
import torch

from protocol.verification_policy import (
    EXACT_POLICY,
    PAPER_POLICY,
    RunVerification,
    default_run_verification,
)
from tests.helpers.scenarios import Lab
from training.sampling import seeded_scores
from verification.recompute import recompute
from verification.verdict import GroupClaims, RejectReason, RolloutVerifier, judge

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lab() -> Lab:
    return Lab(completion_tokens=64)


def test_a_claim_of_a_precision_or_device_the_run_does_not_allow_is_rejected_with_its_own_reason(
    lab: Lab,
) -> None:
    verification = RunVerification(model="tiny", limits={"bfloat16/cpu": EXACT_POLICY})
    verifier = RolloutVerifier(lab.policy, lab.policy_version, verification)
    honest = lab.build("honest_bf16", 0).claim
    assert verifier.verify(honest).accepted
    fp32 = lab.build("honest_fp32", 0).claim
    on_gpu = honest.model_copy(update={"device": "cuda"})
    assert verifier.verify(fp32).reason is RejectReason.PRECISION_NOT_ALLOWED
    verdict = verifier.verify(on_gpu)
    assert verdict.reason is RejectReason.DEVICE_NOT_ALLOWED and "bfloat16/cpu" in verdict.detail
    batched = verifier.verify_groups([GroupClaims([honest, on_gpu]), GroupClaims([fp32])])
    assert [[v.reason for v in group] for group in batched] == [
        [None, RejectReason.DEVICE_NOT_ALLOWED],
        [RejectReason.PRECISION_NOT_ALLOWED],
    ]


def test_the_policy_hash_names_the_limits_and_the_model() -> None:
    tiny = default_run_verification("tiny")
    assert tiny.sha256 == default_run_verification("tiny").sha256
    assert tiny.sha256 != default_run_verification("hf").sha256
    tighter = RunVerification(
        model="tiny",
        limits={**tiny.limits, "float32/cpu": EXACT_POLICY.model_copy(update={"max_value_mismatches": 2})},
    )
    assert tighter.sha256 != tiny.sha256
    assert RunVerification.model_validate_json(tiny.model_dump_json()).sha256 == tiny.sha256
    with pytest.raises(ValueError, match="<dtype>/<device>"):
        RunVerification(model="tiny", limits={"float64/cpu": EXACT_POLICY})
    assert default_run_verification("hf").for_claim("float16", "mps") == PAPER_POLICY


def _near_ties(logits: torch.Tensor, lab: Lab, seed: int, tol: float) -> list[tuple[int, int]]:
    """(position, runner-up token) wherever the runner-up's seeded score is within `tol` logits of the choice."""
    scores = seeded_scores(logits, lab.sampling.temperature, seed, list(range(logits.shape[0])))
    top = scores.topk(2, dim=-1)
    close = (top.values[:, 0] - top.values[:, 1]) * lab.sampling.temperature <= tol
    return [(int(i), int(top.indices[i, 1])) for i in torch.nonzero(close).flatten()]


def test_tokens_at_near_ties_are_accepted_up_to_the_allowance_and_counted_beyond_it(lab: Lab) -> None:
    """A worker taking the runner-up at near ties: within the tolerance each such token passes, but a
    rollout may hold only `max_near_tie_deviations` of them; on an exact policy not one passes."""
    claim = lab.build("honest_fp32", 1).claim
    model = lab.model("policy", torch.float32)
    hidden, logits = recompute(claim, model)
    tol = 0.5  # logits: wide, so that a 64-token rollout has several near ties
    ties = _near_ties(logits, lab, claim.seed, tol)
    assert len(ties) >= 3
    cheat_ids = list(claim.completion_ids)
    for position, runner_up in ties:
        cheat_ids[position] = runner_up
    cheat = claim.model_copy(update={"completion_ids": cheat_ids})
    loose = EXACT_POLICY.model_copy(update={"sampling_abs_tol": tol, "max_near_tie_deviations": len(ties)})
    assert judge(claim, hidden, logits, policy=loose).accepted
    assert judge(cheat, hidden, logits, policy=loose).accepted
    counted = loose.model_copy(update={"max_near_tie_deviations": len(ties) - 1})
    verdict = judge(cheat, hidden, logits, policy=counted)
    assert verdict.reason is RejectReason.SAMPLING_NEAR_TIES
    assert verdict.failing_position == ties[0][0] and verdict.sampling is not None
    assert verdict.sampling.deviations == len(ties)
    assert judge(cheat, hidden, logits, policy=EXACT_POLICY).reason is RejectReason.SAMPLING


def test_the_near_tie_allowance_grows_with_the_rollout() -> None:
    policy = PAPER_POLICY.model_copy(update={"max_near_tie_deviations": 2, "near_tie_tokens": 100})
    assert [policy.near_tie_allowance(n) for n in (1, 100, 101, 250)] == [2, 2, 3, 5]
    assert EXACT_POLICY.near_tie_allowance(10_000) == 0
