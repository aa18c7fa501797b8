"""The rollout verdict on real TinyGPT rollouts: honest ones accepted, every tampering rejected."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from protocol.toploc import build_proofs
from protocol.verification_policy import EXACT_POLICY
from tests.helpers.scenarios import HONEST_KINDS, KINDS, TAMPERED_KINDS, Lab
from training.generation import generate
from training.sampling import SamplingParams
from verification.recompute import recompute
from verification.rollout import RolloutClaim
from verification.verdict import RejectReason, RolloutVerifier, judge, summarize

TOPLOC_REASONS = {
    RejectReason.TOPLOC_EXPONENT,
    RejectReason.TOPLOC_SIGN,
    RejectReason.TOPLOC_MANTISSA,
    RejectReason.TOPLOC_VALUES,
}
EXPECTED_REASONS: dict[str, set[RejectReason]] = {
    "other_model": TOPLOC_REASONS,
    "perturbed_1pct": TOPLOC_REASONS,
    "prompt_altered": TOPLOC_REASONS,
    "fp32_as_bf16": TOPLOC_REASONS,
    "bf16_as_fp32": TOPLOC_REASONS,
    "fp16_as_bf16": TOPLOC_REASONS,
    "fp16_as_fp32": TOPLOC_REASONS,
    "greedy": {RejectReason.SAMPLING},
    "swapped_token": {RejectReason.SAMPLING},
    "truncated_proofs": {RejectReason.MALFORMED_PROOF},
    "truncated_proof_bytes": {RejectReason.MALFORMED_PROOF},
    "reordered_proofs": TOPLOC_REASONS,
}
assert set(EXPECTED_REASONS) == set(TAMPERED_KINDS)

HONEST_CASES = 6
TAMPERED_CASES = 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lab() -> Lab:
    return Lab(completion_tokens=96)


@pytest.fixture(scope="module")
def verifier(lab: Lab) -> RolloutVerifier:
    return RolloutVerifier(lab.policy, lab.policy_version)


def run_kind(lab: Lab, verifier: RolloutVerifier, kind: str, cases: range):
    out = []
    for case in cases:
        sc = lab.build(kind, case)
        out.append((case, verifier.verify(sc.claim, assigned_prompt_ids=sc.assigned_prompt_ids)))
    return out


@pytest.mark.parametrize("kind", HONEST_KINDS)
def test_honest_rollouts_are_accepted(lab, verifier, kind):
    results = run_kind(lab, verifier, kind, range(HONEST_CASES))
    rejected = [(case, str(v)) for case, v in results if not v.accepted]
    assert not rejected, f"false rejects for {kind}: {rejected}"
    for _, v in results:
        assert len(v.chunks) == 3
        assert all(c.value_mismatches == 0 for c in v.chunks)
        assert v.sampling is not None and v.sampling.max_gap == 0.0


@pytest.mark.parametrize("kind", TAMPERED_KINDS)
def test_tampered_rollouts_are_rejected(lab, verifier, kind):
    results = run_kind(lab, verifier, kind, range(TAMPERED_CASES))
    accepted = [case for case, v in results if v.accepted]
    assert not accepted, f"false accepts for {kind}: cases {accepted}"
    for case, v in results:
        assert v.reason in EXPECTED_REASONS[kind], f"{kind} case {case}: {v}"
        if v.reason in TOPLOC_REASONS or v.reason == RejectReason.SAMPLING:
            assert v.failing_chunk is not None


def test_swapped_token_is_pinned_to_its_position(lab, verifier):
    sc = lab.build("swapped_token", 0)
    honest = lab.build("honest_bf16", 0)
    # Same prompt and seed: the completions agree up to the swapped position.
    first_diff = next(
        i
        for i, (a, b) in enumerate(zip(sc.claim.completion_ids, honest.claim.completion_ids, strict=True))
        if a != b
    )
    v = verifier.verify(sc.claim)
    assert v.reason == RejectReason.SAMPLING
    assert v.failing_position == first_diff
    assert v.failing_chunk == first_diff // 32
    # Its activations are honest: every TOPLOC figure is zero.
    assert all(c.value_mismatches == 0 for c in v.chunks)


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.5)]
)
def test_other_sampling_params(params):
    lab = Lab(completion_tokens=64, sampling=params)
    verifier = RolloutVerifier(lab.policy, lab.policy_version)
    for case in range(3):
        for kind in ("honest_bf16", "honest_fp32"):
            assert verifier.verify(lab.build(kind, case).claim).accepted
        for kind in ("greedy", "swapped_token"):
            assert verifier.verify(lab.build(kind, case).claim).reason == RejectReason.SAMPLING


def test_token_outside_top_p_nucleus_is_rejected():
    params = SamplingParams(temperature=0.5, top_p=0.3)
    lab = Lab(completion_tokens=40, sampling=params)
    verifier = RolloutVerifier(lab.policy, lab.policy_version)
    model = lab.model("policy", torch.bfloat16)

    def least_likely(i: int, logits: torch.Tensor, sampled: int) -> int:
        return int(logits.argmin()) if i == 20 else sampled

    out = generate(model, [1, 2, 3], 40, params, seed=5, choose=least_likely)
    claim = _claim(lab, [1, 2, 3], out.completion_ids, out.proofs, sampling=params, seed=5)
    v = verifier.verify(claim)
    assert v.reason == RejectReason.SAMPLING and v.failing_position == 20
    assert v.sampling is not None and v.sampling.gaps[20] == float("inf")


def _claim(lab: Lab, prompt, completion, proofs, **overrides) -> RolloutClaim:
    fields: dict[str, object] = {
        "prompt_ids": list(prompt),
        "completion_ids": list(completion),
        "policy_version": lab.policy_version,
        "sampling": lab.sampling,
        "seed": 11,
        "dtype": "bfloat16",
        "device": "cpu",
        "proofs": list(proofs),
    }
    fields.update(overrides)
    return RolloutClaim.model_validate(fields)


def test_claim_level_rejections(lab, verifier):
    sc = lab.build("honest_bf16", 1)
    claim = sc.claim
    assert verifier.verify(claim, assigned_prompt_ids=sc.assigned_prompt_ids).accepted

    stale = claim.model_copy(update={"policy_version": lab.policy_version - 1})
    assert verifier.verify(stale).reason == RejectReason.POLICY_VERSION

    other_prompt = [*sc.assigned_prompt_ids[:-1], (sc.assigned_prompt_ids[-1] + 1) % 256]
    assert verifier.verify(claim, assigned_prompt_ids=other_prompt).reason == RejectReason.PROMPT_MISMATCH

    assert verifier.verify(claim, assigned_seed=claim.seed).accepted
    assert verifier.verify(claim, assigned_seed=claim.seed ^ 1).reason == RejectReason.SEED_MISMATCH

    out_of_vocab = claim.model_copy(update={"completion_ids": [*claim.completion_ids[:-1], 256]})
    assert verifier.verify(out_of_vocab).reason == RejectReason.MALFORMED_CLAIM

    too_long = claim.model_copy(update={"prompt_ids": [0] * lab.config.max_seq_len})
    assert verifier.verify(too_long).reason == RejectReason.MALFORMED_CLAIM


def test_malformed_proofs_are_rejections_not_crashes(lab, verifier):
    claim = lab.build("honest_bf16", 2).claim
    proofs = claim.proofs
    bad_sets = [
        [],
        [*proofs, proofs[0]],
        [b"\x00\x00" + proofs[0][2:], *proofs[1:]],  # modulus 0
        [b"\xff\xff" + proofs[0][2:], *proofs[1:]],  # modulus 65535
        [proofs[0] + b"\x00", *proofs[1:]],
        [b"", *proofs[1:]],
    ]
    for bad in bad_sets:
        v = verifier.verify(claim.model_copy(update={"proofs": bad}))
        assert v.reason == RejectReason.MALFORMED_PROOF, v
        assert "proof" in v.detail


def test_random_proof_bytes_are_rejected(lab, verifier):
    claim = lab.build("honest_bf16", 3).claim
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        junk = [
            bytes(torch.randint(0, 256, (258,), generator=gen, dtype=torch.uint8).tolist())
            for _ in claim.proofs
        ]
        v = verifier.verify(claim.model_copy(update={"proofs": junk}))
        assert not v.accepted and v.reason in TOPLOC_REASONS | {RejectReason.MALFORMED_PROOF}


def test_negated_activations_are_rejected_on_sign(lab, verifier):
    claim = lab.build("honest_bf16", 4).claim
    hidden, logits = recompute(claim, verifier.model_for(torch.bfloat16))
    negated = claim.model_copy(update={"proofs": build_proofs(-hidden.to(torch.bfloat16))})
    v = judge(negated, hidden, logits, policy=EXACT_POLICY)
    assert v.reason == RejectReason.TOPLOC_SIGN
    assert v.chunks[0].exp_mismatches == 0 and v.chunks[0].mant_err_mean == 0.0


def test_claim_is_strict():
    base: dict[str, object] = {
        "prompt_ids": [1, 2],
        "completion_ids": [3],
        "policy_version": 0,
        "sampling": SamplingParams(),
        "seed": 1,
        "dtype": "bfloat16",
        "device": "cpu",
        "proofs": [b"x"],
    }
    RolloutClaim.model_validate(base)
    bads: list[dict[str, object]] = [
        {"extra": 1},
        {"seed": "1"},
        {"seed": -1},
        {"seed": 2**64},
        {"dtype": "float64"},
        {"device": "tpu"},
        {"prompt_ids": []},
        {"completion_ids": [-1]},
        {"proofs": ["not-bytes"]},
        {"proofs": [bytes(5000)]},
        {"policy_version": 1.0},
    ]
    for bad in bads:
        with pytest.raises(ValueError):
            RolloutClaim.model_validate({**base, **bad})
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=1.5)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hundreds_of_rollouts(capsys):
    """Counts per kind over hundreds of rollouts (128-token completions, four chunks each)."""
    lab = Lab(completion_tokens=128)
    verifier = RolloutVerifier(lab.policy, lab.policy_version)
    honest_cases, tampered_cases = 30, 20
    lines = []
    failures = []
    for kind in KINDS:
        honest = kind in HONEST_KINDS
        cases = range(100, 100 + (honest_cases if honest else tampered_cases))
        results = run_kind(lab, verifier, kind, cases)
        wrong = [case for case, v in results if v.accepted != honest]
        if not honest:
            wrong += [
                case for case, v in results if not v.accepted and v.reason not in EXPECTED_REASONS[kind]
            ]
        reasons = Counter(str(v.reason) for _, v in results if not v.accepted)
        what = "false rejects" if honest else "false accepts"
        lines.append(
            f"{kind:22s} {len(wrong)} {what} / {len(results)}  {summarize([v for _, v in results])}  {dict(reasons)}"
        )
        failures += [(kind, case) for case in wrong]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert not failures
