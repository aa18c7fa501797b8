"""Benchmark: calibrated verification on native kernels. Honest rollouts accepted, every cheat class caught.

For each target (the `tiny` backend in bfloat16, and the `hivenet model init` Llama in float32 and in
bfloat16, all on this CPU) it runs, in one process:

1. `hivenet calibrate`'s measurement (`verification.calibration.calibrate`) on one set of prompts
   and seeds, which derives the limits (if some class overlaps, the limits it derived are still
   evaluated below and `calibrated_<target>=0` says no policy would have been written);
2. an evaluation on *fresh* prompts and seeds, by the validator's own path
   (`RolloutVerifier.verify_groups` under the calibrated `RunVerification`):
   - honest rollouts generated with batch sizes 1, 2, 4, 8 and 16 and two thread counts (worker and
     validator on different ones): `honest_rejected_<target>` counts the rejected ones;
   - every cheat class: `detect_<class>_<target>` = rejected / submitted over the rollouts the cheat
     altered (a rollout identical to the honest one is honest); `detect_near_tie_cheat_<target>` for
     the worker that takes the runner-up at every near tie, with `near_tie_altered_<target>` the
     share of its rollouts that had a near tie to take at all;
   - `verify_cost_frac_<target>` = the validator's CPU time over the worker's for the same honest
     rollouts (process CPU clocks: every torch thread counted);
3. `proof_bytes`: the size of one 32-token proof (the reference format's 258).

Targets (issue #24): honest_rejected == 0 over >= 1000 honest rollouts each, detect >= 0.99,
verify_cost_frac <= 0.10, proof_bytes == 258.

    python bench/verification.py --quick   # 160 honest and 20 per cheat class per target, < 3 minutes
    python bench/verification.py           # 1000 honest and 100 per cheat class per target

Ends with one line `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from protocol.verification_policy import RunVerification, policy_key  # noqa: E402
from training.hf_model import quiet_transformers  # noqa: E402
from training.model_init import init_model_dir  # noqa: E402
from training.rl_run import RLRunConfig  # noqa: E402
from training.run_model import HFModelRef  # noqa: E402
from verification.calibration import (  # noqa: E402
    Calibration,
    CalibrationOverlap,
    CalibrationPlan,
    calibrate,
    worker_threads,
)
from verification.calibration_setup import CalibrationTarget, calibration_target  # noqa: E402
from verification.cheats import Assignment, cheat_classes  # noqa: E402
from verification.rollout import RolloutClaim  # noqa: E402
from verification.verdict import GroupClaims, RolloutVerifier, Verdict  # noqa: E402

EVAL_BATCHES = (1, 2, 4, 8, 16)
CHEAT_BATCH = 4


def _assignment(rng: random.Random, target: CalibrationTarget, size: int) -> Assignment:
    return Assignment(
        prompt=target.prompts(rng.randrange(2**31)),
        seeds=[rng.randrange(2**64) for _ in range(size)],
        max_new_tokens=rng.randint(min(8, target.max_new_tokens), target.max_new_tokens),
    )


def _verdicts(verifier: RolloutVerifier, claims: list[RolloutClaim]) -> list[Verdict]:
    """The verdict on each claim, judged on its own (a group stops at its first rejection)."""
    return [group[0] for group in verifier.verify_groups([GroupClaims([c]) for c in claims])]


def evaluate(
    target: CalibrationTarget, calibration: Calibration, honest_n: int, cheat_n: int, seed: int
) -> dict:
    """The evaluation on fresh prompts and seeds (see the module docstring)."""
    factory = target.factory
    verification = RunVerification(
        model=target.model_id, limits={policy_key(factory.dtype, factory.device_class): calibration.policy}
    )
    verifier = RolloutVerifier(factory.model, 0, verification)
    rng = random.Random(seed)
    rejected = total = 0
    worker_cpu = validator_cpu = 0.0
    turn = 0
    while total < honest_n:
        size = min(EVAL_BATCHES[turn % len(EVAL_BATCHES)], honest_n - total)
        a = _assignment(rng, target, size)
        with worker_threads(1 + turn % 2):
            started = time.process_time()
            claims = [claim for claim, _ in factory.honest(a)]
            worker_cpu += time.process_time() - started
        with worker_threads(2 - turn % 2):
            started = time.process_time()
            verdicts = _verdicts(verifier, claims)
            validator_cpu += time.process_time() - started
        for verdict in verdicts:
            if not verdict.accepted:
                rejected += 1
                print(f"  honest rollout rejected: {verdict}", flush=True)
        total += len(claims)
        turn += 1
    out: dict[str, float] = {"honest_rejected": rejected, "honest_total": total}
    out["verify_cost_frac"] = validator_cpu / worker_cpu
    for kind in cheat_classes(factory.dtype):
        caught = altered = tries = 0
        while altered < cheat_n and tries < 8 * cheat_n:
            made = factory.cheat(kind, _assignment(rng, target, CHEAT_BATCH))
            tries += len(made)
            claims = [c for c in made if c is not None]
            if claims:
                caught += sum(not v.accepted for v in _verdicts(verifier, claims))
                altered += len(claims)
        key = "near_tie_cheat" if kind == "near_tie" else kind
        out[f"detect_{key}"] = caught / altered if altered else math.nan
        out[f"{key}_altered"] = altered
        if kind == "near_tie":
            out["near_tie_altered"] = altered / tries
    return out


def run_target(name: str, config: RLRunConfig, dtype: str, args: argparse.Namespace) -> dict:
    target = calibration_target(config, dtype, torch.device("cpu"), seed=args.seed)
    plan = CalibrationPlan(
        honest_rollouts=args.calibration_rollouts, cheat_rollouts=args.cheat_rollouts, seed=args.seed
    )
    started = time.perf_counter()
    try:
        calibration = calibrate(target.factory, target.prompts, target.max_new_tokens, plan)
        calibrated = 1
    except CalibrationOverlap as exc:
        print(f"[{name}] calibration refused: {exc}", flush=True)
        calibration, calibrated = exc.calibration, 0
    print(f"[{name}] calibrated in {time.perf_counter() - started:.0f} s: {calibration.policy}", flush=True)
    result = evaluate(target, calibration, args.honest, args.cheats, args.seed + 1)
    result["calibrated"] = calibrated
    print(f"[{name}] evaluated in {time.perf_counter() - started:.0f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rollouts (under 3 minutes), same keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model-dir", type=Path, help="a `hivenet model init` directory (default: built here)"
    )
    args = parser.parse_args()
    args.honest = 160 if args.quick else 1000
    args.cheats = 20 if args.quick else 100
    args.calibration_rollouts = 200 if args.quick else 1000
    args.cheat_rollouts = 16 if args.quick else 64
    quiet_transformers()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir or init_model_dir(Path(scratch) / "model")
        hf = RLRunConfig(hf_model=HFModelRef.of_directory(model_dir))
        targets = [
            ("tiny_bfloat16", RLRunConfig(), "bfloat16"),
            ("hf_float32", hf, "float32"),
            ("hf_bfloat16", hf, "bfloat16"),
        ]
        results = {name: run_target(name, config, dtype, args) for name, config, dtype in targets}
    keys = sorted({k for r in results.values() for k in r if k.startswith("detect_")})
    print(f"\n{'figure':<34}" + "".join(f"{name:>16}" for name in results))
    for key in [
        "calibrated",
        "honest_total",
        "honest_rejected",
        "verify_cost_frac",
        "near_tie_altered",
        *keys,
    ]:
        print(f"{key:<34}" + "".join(f"{r.get(key, math.nan):>16.4g}" for r in results.values()))
    from protocol.toploc import build_proofs

    proof_bytes = len(build_proofs(torch.randn(32, 256).to(torch.bfloat16))[0])
    pairs = [f"proof_bytes={proof_bytes}"]
    for name, r in results.items():
        for key in ["calibrated", "honest_rejected", "verify_cost_frac", "near_tie_altered", *keys]:
            value = r.get(key, math.nan)
            pairs.append(f"{key}_{name}={value:.4g}" if isinstance(value, float) else f"{key}_{name}={value}")
    print("RESULT " + " ".join(pairs))


if __name__ == "__main__":
    main()
