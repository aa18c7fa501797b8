"""The batched verdict path (one prefill and one sampling check per group) against the per-rollout
one, on honest and tampered rollouts: bit-identical recomputed rows and sampling figures,
identical verdicts, the same first rejection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.scenarios import HONEST_KINDS, KINDS, Lab, Scenario
from training.model import ModelConfig
from training.sampling import SamplingParams
from verification.rollout import CLAIM_DTYPES
from verification.sampling_check import check_sampling, check_sampling_batch
from verification.verdict import (
    GroupClaims,
    RejectReason,
    RolloutVerifier,
    Verdict,
    recompute,
    recompute_batch,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = (0, 1)


@pytest.fixture(scope="module")
def lab() -> Lab:
    # Prompts of 8..40 tokens plus 40-token completions: some sequences fit one attention block
    # (64 queries) on their own while the padded batch does not.
    return Lab(ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=160), completion_tokens=40)


@pytest.fixture(scope="module")
def verifier(lab: Lab) -> RolloutVerifier:
    return RolloutVerifier(lab.policy, lab.policy_version)


@pytest.fixture(scope="module")
def scenarios(lab: Lab) -> dict[tuple[str, int], Scenario]:
    return {(kind, case): lab.build(kind, case) for kind in KINDS for case in CASES}


def verdict_key(v: Verdict) -> tuple[object, ...]:
    sampling = None if v.sampling is None else (v.sampling.gaps.tobytes(), v.sampling.tolerances.tobytes())
    return (v.accepted, v.reason, v.detail, v.failing_chunk, v.failing_position, v.chunks, sampling)


def one_by_one(verifier: RolloutVerifier, scs: list[Scenario], seeds: list[int]) -> list[Verdict]:
    """The per-rollout path: `verify` on each claim in turn, up to the first rejection."""
    out = []
    for sc, seed in zip(scs, seeds, strict=True):
        out.append(verifier.verify(sc.claim, assigned_prompt_ids=sc.assigned_prompt_ids, assigned_seed=seed))
        if not out[-1].accepted:
            break
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_batched_rows_are_bit_identical_to_one_prefill_per_claim(lab, verifier, scenarios, dtype):
    claims = [sc.claim for sc in scenarios.values() if sc.claim.dtype == dtype]
    lengths = {len(c.prompt_ids) + len(c.completion_ids) - 1 for c in claims}
    assert len(claims) >= 2 and len(lengths) > 1 and min(lengths) <= 64 < max(lengths)
    model = verifier.model_for(CLAIM_DTYPES[dtype])
    batch = recompute_batch(claims, model)
    assert len(batch) == len(claims)
    for claim, (hidden, logits) in zip(claims, batch, strict=True):
        alone_hidden, alone_logits = recompute(claim, model)
        assert hidden.dtype == alone_hidden.dtype == CLAIM_DTYPES[dtype]
        assert torch.equal(hidden, alone_hidden)
        assert torch.equal(logits, alone_logits)


def test_batched_verdicts_match_one_by_one_for_every_kind(verifier, scenarios):
    for (kind, case), sc in scenarios.items():
        # Alone, and behind two honest rollouts in other precisions (the batch holds every precision).
        honest = [scenarios[("honest_fp32", 1 - case)], scenarios[("honest_fp16", 1 - case)]]
        for group in ([sc], [*honest, sc]):
            seeds = [s.claim.seed for s in group]
            batched = verifier.verify_group(
                [s.claim for s in group], assigned_prompt_ids=None, assigned_seeds=seeds
            )
            expected = one_by_one(verifier, group, seeds)
            assert [verdict_key(v) for v in batched] == [verdict_key(v) for v in expected], (kind, case)
            assert batched[-1].accepted == sc.honest, (kind, case, str(batched[-1]))


def test_a_group_stops_at_its_first_rejection(verifier, scenarios):
    group = [
        scenarios[("honest_bf16", 0)],
        scenarios[("greedy", 0)],
        scenarios[("honest_bf16", 1)],
        scenarios[("other_model", 1)],
    ]
    seeds = [sc.claim.seed for sc in group]
    verdicts = verifier.verify_group([sc.claim for sc in group], assigned_seeds=seeds)
    assert [v.accepted for v in verdicts] == [True, False]
    assert verdicts[1].reason == RejectReason.SAMPLING
    assert [verdict_key(v) for v in verdicts] == [verdict_key(v) for v in one_by_one(verifier, group, seeds)]


def test_groups_verified_together_get_the_verdicts_of_each_group_alone(verifier, scenarios):
    """One group's rejection (early or late) changes nothing in the groups verified with it."""
    kinds = list(scenarios)
    groups = [[scenarios[key] for key in kinds[i : i + 3]] for i in range(0, len(kinds), 3)]
    requests = []
    for i, group in enumerate(groups):
        seeds = [sc.claim.seed for sc in group]
        if i == 1:
            seeds[0] ^= 1  # rejected before any prefill: its group holds nothing else
        requests.append(GroupClaims([sc.claim for sc in group], None, seeds))
    together = verifier.verify_groups(requests)
    alone = [verifier.verify_group(r.claims, assigned_seeds=r.assigned_seeds) for r in requests]
    assert [[verdict_key(v) for v in verdicts] for verdicts in together] == [
        [verdict_key(v) for v in verdicts] for verdicts in alone
    ]
    assert len(together[1]) == 1 and together[1][0].reason == RejectReason.SEED_MISMATCH
    assert any(not verdicts[-1].accepted for verdicts in together) and any(
        all(v.accepted for v in verdicts) for verdicts in together
    )


def test_claim_check_failures_keep_their_place_in_the_group(verifier, scenarios):
    honest = [scenarios[(kind, case)] for kind in HONEST_KINDS for case in CASES]
    claims = [sc.claim for sc in honest]
    seeds = [c.seed for c in claims]
    seeds[3] ^= 1  # the fourth rollout's seed is not the assigned one: rejected before any prefill
    verdicts = verifier.verify_group(claims, assigned_seeds=seeds)
    assert [v.accepted for v in verdicts] == [True, True, True, False]
    assert verdicts[3].reason == RejectReason.SEED_MISMATCH
    assert [verdict_key(v) for v in verdicts] == [verdict_key(v) for v in one_by_one(verifier, honest, seeds)]

    bad_dtype = claims[0].model_copy(update={"dtype": "int8"})
    first = verifier.verify_group([bad_dtype, *claims[1:]])
    assert len(first) == 1 and first[0].reason == RejectReason.MALFORMED_CLAIM
    stale = claims[1].model_copy(update={"policy_version": verifier.policy_version + 1})
    second = verifier.verify_group([claims[0], stale, claims[2]])
    assert [v.reason for v in second] == [None, RejectReason.POLICY_VERSION]

    assert verifier.verify_group([]) == []
    with pytest.raises(ValueError, match="assigned seeds"):
        verifier.verify_group(claims, assigned_seeds=seeds[:-1])


def test_every_honest_group_is_accepted_whole(verifier, scenarios):
    honest = [scenarios[(kind, case)] for kind in HONEST_KINDS for case in CASES]
    verdicts = verifier.verify_group([sc.claim for sc in honest])
    assert len(verdicts) == len(honest) and all(v.accepted for v in verdicts)
    for v in verdicts:
        assert v.sampling is not None and v.sampling.max_gap == 0.0
        assert all(c.value_mismatches == 0 for c in v.chunks)
        assert np.all(v.sampling.gaps == 0.0)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)])
def test_a_batched_sampling_check_gives_each_completion_its_own_figures(params):
    gen = torch.Generator().manual_seed(3)
    lengths = [5, 1, 17, 9]
    logits = [(3.0 * torch.randn(n, 256, generator=gen)).to(torch.bfloat16) for n in lengths]
    tokens = [torch.randint(0, 256, (n,), generator=gen) for n in lengths]
    tokens[2] = logits[2].float().argmax(dim=-1)  # greedy rows: small gaps, some zero
    seeds = [11, 2**64 - 1, 0, 12345]
    batch = check_sampling_batch(logits, tokens, params, seeds, abs_tol=1e-3, rel_tol=2.0**-6)
    assert len(batch) == len(lengths)
    for row, tok, seed, got in zip(logits, tokens, seeds, batch, strict=True):
        alone = check_sampling(row, tok, params, seed, abs_tol=1e-3, rel_tol=2.0**-6)
        assert got.gaps.shape == (row.shape[0],)
        assert got.gaps.tobytes() == alone.gaps.tobytes()
        assert got.tolerances.tobytes() == alone.tolerances.tobytes()
    assert check_sampling_batch([], [], params, [], abs_tol=1e-3, rel_tol=0.0) == []
    with pytest.raises(ValueError, match="seeds"):
        check_sampling_batch(logits, tokens, params, seeds[:-1], abs_tol=1e-3, rel_tol=0.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("prompt_len", [1, 2, 30])
def test_completions_of_one_prompt_share_its_pass_and_keep_their_own_rows(lab, verifier, dtype, prompt_len):
    """A group's rollouts answer one prompt: the batch computes the prompt once, and each claim's rows
    are still bit for bit those of its own prefill, whatever the completions' lengths."""
    rng = np.random.default_rng(prompt_len)
    vocab = lab.policy.config.vocab_size
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    other_prompt = rng.integers(0, vocab, prompt_len + 3).tolist()
    template = lab.build("honest_fp32", 0).claim

    def claim(prompt_ids: list[int], completion_len: int):
        return template.model_copy(
            update={
                "prompt_ids": prompt_ids,
                "completion_ids": rng.integers(0, vocab, completion_len).tolist(),
                "dtype": dtype,
            }
        )

    claims = [claim(prompt, n) for n in (1, 7, 40, 3)] + [claim(other_prompt, 5), claim(prompt, 12)]
    model = verifier.model_for(CLAIM_DTYPES[dtype])
    batch = recompute_batch(claims, model)
    assert len(batch) == len(claims)
    for c, (hidden, logits) in zip(claims, batch, strict=True):
        alone_hidden, alone_logits = recompute(c, model)
        assert hidden.shape[0] == len(c.completion_ids)
        assert torch.equal(hidden, alone_hidden)
        assert torch.equal(logits, alone_logits)
