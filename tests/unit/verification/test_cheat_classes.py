"""Every cheat class of `hivenet calibrate` is rejected, and the honest control accepted, on the exact
`tiny` backend (built-in limits) and on a Hugging Face model's native kernels (calibrated limits)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from protocol.verification_policy import RunVerification, policy_key
from tests.helpers.calibrated import calibrated
from training.generation import generate_group
from training.grpo import GRPOConfig, ScoredRollout
from training.model import ModelConfig, TinyGPT
from training.model_init import init_model_dir
from training.rl_run import RLRunConfig
from training.run_model import HFModelRef
from training.sampling import SamplingParams
from verification.calibration_setup import calibration_target
from verification.cheats import CHEAT_CLASSES, Assignment, RolloutFactory, cheat_classes
from verification.rollout import RolloutClaim
from verification.verdict import GroupClaims, RejectReason, RolloutVerifier

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLING = SamplingParams(temperature=1.0)


def _tiny_factory(dtype: str) -> RolloutFactory:
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(n_layers=2, d_model=64, n_heads=4, max_seq_len=128)).eval()
    rng = random.Random(1)

    def grpo_batch() -> Sequence[Sequence[ScoredRollout]]:
        prompt = [rng.randrange(256) for _ in range(6)]
        outs = generate_group(model, prompt, 24, SAMPLING, [rng.randrange(2**32) for _ in range(4)])
        return [[ScoredRollout(prompt, o.completion_ids, rng.random(), 0, b"g") for o in outs]]

    return RolloutFactory(
        model=model, dtype=dtype, device=torch.device("cpu"), sampling=SAMPLING, grpo_batch=grpo_batch,
        grpo=GRPOConfig(group_size=4),
    )  # fmt: skip


def _assignments(count: int, seed: int, vocab: int, new_tokens: int = 45) -> list[Assignment]:
    rng = random.Random(seed)
    return [
        Assignment(
            [rng.randrange(vocab) for _ in range(rng.randint(4, 20))],
            [rng.randrange(2**64) for _ in range(4)],
            new_tokens,
        )
        for _ in range(count)
    ]


def _judge(verifier: RolloutVerifier, claims: list[RolloutClaim]) -> list:
    return [group[0] for group in verifier.verify_groups([GroupClaims([c]) for c in claims])]


def _altered(factory: RolloutFactory, kind: str, assignments: list[Assignment]) -> list[RolloutClaim]:
    return [c for a in assignments for c in factory.cheat(kind, a) if c is not None]


@pytest.fixture(scope="module")
def tiny() -> RolloutFactory:
    return _tiny_factory("bfloat16")


def test_the_honest_control_is_accepted_on_the_exact_backend(tiny: RolloutFactory) -> None:
    verifier = RolloutVerifier(tiny.model, 0)  # the tiny backend's built-in exact limits
    claims = [claim for a in _assignments(3, 0, 256) for claim, _ in tiny.honest(a)]
    assert len(claims) == 12 and all(v.accepted for v in _judge(verifier, claims))


@pytest.mark.parametrize("kind", cheat_classes("bfloat16"))
def test_every_cheat_class_is_rejected_on_the_exact_backend(tiny: RolloutFactory, kind: str) -> None:
    verifier = RolloutVerifier(tiny.model, 0)
    if kind == "near_tie":
        tiny.near_tie_rel_tol = 0.05  # a worker that assumes some tolerance: the exact backend has none
    try:
        claims = _altered(tiny, kind, _assignments(3, 1, 256))
    finally:
        tiny.near_tie_rel_tol = 0.0
    assert len(claims) >= 4, f"{kind} altered too few rollouts to judge"
    verdicts = _judge(verifier, claims)
    assert not any(v.accepted for v in verdicts), [str(v) for v in verdicts if v.accepted]
    if kind in ("greedy", "other_temperature", "last_chunk_swapped", "near_tie"):
        assert {v.reason for v in verdicts} <= {RejectReason.SAMPLING, RejectReason.SAMPLING_NEAR_TIES}


def test_the_catalogue_names_every_class_once() -> None:
    assert len(set(CHEAT_CLASSES)) == len(CHEAT_CLASSES) == 16
    assert "precision_float32" not in cheat_classes("float32") and "precision_bfloat16" in cheat_classes(
        "float32"
    )


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> RLRunConfig:
    model_dir: Path = init_model_dir(
        tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=20
    )
    return calibrated(RLRunConfig(hf_model=HFModelRef.of_directory(model_dir)), rollouts=64, cheat_rollouts=8)


def test_on_native_kernels_calibrated_limits_accept_fresh_honest_rollouts_and_reject_every_cheat(
    hf_run: RLRunConfig,
) -> None:
    target = calibration_target(hf_run, "float32", torch.device("cpu"), seed=5)  # fresh prompts and seeds
    verifier = RolloutVerifier(target.factory.model, 0, hf_run.run_verification)
    rng = random.Random(9)
    fresh = [
        Assignment(
            target.prompts(rng.randrange(2**31)),
            [rng.randrange(2**64) for _ in range(4)],
            target.max_new_tokens,
        )
        for _ in range(4)
    ]
    honest = [claim for a in fresh for claim, _ in target.factory.honest(a)]
    assert all(v.accepted for v in _judge(verifier, honest))
    target.factory.near_tie_rel_tol = hf_run.run_verification.limits[
        policy_key("float32", "cpu")
    ].sampling_rel_tol
    for kind in cheat_classes("float32"):
        claims = _altered(target.factory, kind, fresh)
        verdicts = _judge(verifier, claims)
        assert not any(v.accepted for v in verdicts), (kind, [str(v) for v in verdicts if v.accepted])


def test_a_claim_of_the_calibrated_precision_on_another_device_is_refused(hf_run: RLRunConfig) -> None:
    verification: RunVerification = hf_run.run_verification
    assert verification.allowed() == "float32/cpu"
    target = calibration_target(hf_run, "float32", torch.device("cpu"))
    claim = target.factory.honest(Assignment(target.prompts(3), [1], 8))[0][0]
    verifier = RolloutVerifier(target.factory.model, 0, verification)
    assert (
        _judge(verifier, [claim.model_copy(update={"device": "cuda"})])[0].reason
        is RejectReason.DEVICE_NOT_ALLOWED
    )
