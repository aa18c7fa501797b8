"""Benchmark: the cost of TOPLOC proofs and rollout verification against generation itself.

On the default TinyGPT (bf16) with 256-token completions it measures, in one run:

1. proof-building overhead: the time spent building the proofs of a rollout as a fraction
   of generating it (target < 2%); the end-to-end difference between generating with and
   without proofs is printed too, but it is the difference of two noisy timings;
2. verification speed-up: generation time vs the full verdict (one prefill + proof checks +
   sampling check) on the same rollouts (target >= 20x; the paper reports up to 100x).
   `verify_speedup` puts both sides on the same machine, each at its fastest: the verdict on
   all cores (a prefill is one batch of matrix products and parallelises) and generation at
   whichever of one thread or all cores is faster (it goes token by token and gains nothing
   from threads). That is the paper's comparison, where a GPU prefill uses the whole chip.
   `verify_speedup_1t` gives each side one thread: the ratio per core, i.e. how many
   generating cores one verifying core keeps up with (`verify_speedup_cpu`: the same in the
   thread's CPU time, which leaves out the time the scheduler gave to other processes).
   Each is the median over rollouts of (generation / verdict), each verdict timed (median
   of 3) right after its generation; `verify_speedup_stream` re-verifies all rollouts back
   to back on all cores, as a trainer does, and divides total generation by total verdict
   time. No batching: each verdict runs its own single-rollout prefill (batching measured
   slower per rollout on CPU: the prefill is bound by its float64 matrix products);
3. proof bytes per 32 tokens (258) and the compression ratio against the raw bf16 activations.

If a scratch virtualenv with the reference `toploc` package exists (default
`/tmp/toploc-ref/bin/python`, see `--reference-python`), it also times the reference's
build/verify per chunk beside ours on the same activations and checks the bytes agree.
`--calibrate` prints the per-kind distribution of verification figures that
`protocol/verification_policy.py`'s EXACT_POLICY justifies its thresholds with (`hivenet calibrate` measures any model).

Usage: `python bench/toploc.py [--quick] [--calibrate]`. The last line is
`RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from protocol.toploc import build_proofs, verify_proofs  # noqa: E402
from training.generation import generate  # noqa: E402
from training.model import ModelConfig, TinyGPT  # noqa: E402
from training.sampling import SamplingParams  # noqa: E402
from verification.rollout import RolloutClaim  # noqa: E402
from verification.verdict import RolloutVerifier  # noqa: E402

REFERENCE_SCRIPT = r"""
import sys, time, torch
from toploc import build_proofs_bytes, verify_proofs_bytes
act = torch.load(sys.argv[1])
reps = int(sys.argv[2])
build_proofs_bytes(act, 32, 128, skip_prefill=True)
t = time.perf_counter()
for _ in range(reps):
    proofs = build_proofs_bytes(act, 32, 128, skip_prefill=True)
build = (time.perf_counter() - t) / reps
t = time.perf_counter()
for _ in range(reps):
    res = verify_proofs_bytes(act, proofs, 32, 128, skip_prefill=True)
verify = (time.perf_counter() - t) / reps
torch.save(proofs, sys.argv[3])
print(build, verify)
"""


VERIFY_REPEATS = 3


def _timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def _timed_cpu(fn, *args, **kwargs):
    """`(out, wall seconds, CPU seconds of the calling thread)`.

    With one torch thread every op runs on the calling thread, so its CPU time is the work
    done, without the time the scheduler gave to other processes on a shared machine.
    """
    c, t = time.thread_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t, time.thread_time() - c


def _verify_timed(verifier: RolloutVerifier, claim: RolloutClaim, threads: int):
    """Median of three back-to-back verdicts: `(verdict, wall s, thread CPU s)`.

    One 30 ms timing on a shared machine is at the mercy of a single scheduler hiccup; a
    0.5 s generation is not.
    """
    torch.set_num_threads(threads)
    timings = [_timed_cpu(verifier.verify, claim) for _ in range(VERIFY_REPEATS)]
    return (
        timings[0][0],
        statistics.median(t for _, t, _ in timings),
        statistics.median(c for _, _, c in timings),
    )


def bench_rollouts(n_rollouts: int, completion: int, dtype: torch.dtype, all_cores: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig()).to(dtype).eval()
    verifier = RolloutVerifier(model, policy_version=1)
    params = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(0)
    rows: list[dict[str, float]] = []
    claims: list[RolloutClaim] = []
    torch.set_num_threads(1)
    generate(model, [1, 2, 3], 32, params, seed=0)  # warm-up
    for _ in range(n_rollouts):
        prompt = rng.integers(0, 256, size=int(rng.integers(16, 48))).tolist()
        seed = int(rng.integers(0, 2**63))
        # Interleave everything so drifting machine load hits all variants alike.
        torch.set_num_threads(1)
        _, t_plain = _timed(generate, model, prompt, completion, params, seed, prove=False)
        # Inline proofs: the worst case (the default background thread hides even this).
        out, t_gen_1, c_gen_1 = _timed_cpu(
            generate, model, prompt, completion, params, seed, background_proofs=False
        )
        torch.set_num_threads(all_cores)
        _, t_gen_all = _timed(generate, model, prompt, completion, params, seed, background_proofs=False)
        claim = RolloutClaim(
            prompt_ids=prompt,
            completion_ids=out.completion_ids,
            policy_version=1,
            sampling=params,
            seed=seed,
            dtype={torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype],  # type: ignore[arg-type]
            device="cpu",
            proofs=out.proofs,
        )
        claims.append(claim)
        verdict_1, t_ver_1, c_ver_1 = _verify_timed(verifier, claim, 1)
        verdict_all, t_ver_all, _ = _verify_timed(verifier, claim, all_cores)
        torch.set_num_threads(1)
        _, t_proofs = _timed(build_proofs, out.hidden)
        # Generation gets whichever thread count is faster for it (decoding gains nothing from
        # threads; on a busy machine more threads can even slow it down).
        t_gen_best = min(t_gen_1, t_gen_all)
        rows.append(
            {
                "gen_plain": t_plain,
                "gen_1": t_gen_1,
                "gen_all": t_gen_all,
                "gen_best": t_gen_best,
                "ver_1": t_ver_1,
                "ver_all": t_ver_all,
                "proofs": t_proofs,
                "speedup": t_gen_best / t_ver_all,
                "speedup_1t": t_gen_1 / t_ver_1,
                "speedup_cpu": c_gen_1 / c_ver_1,
                "accepted": float(verdict_1.accepted and verdict_all.accepted),
            }
        )
    # A trainer verifies a stream of rollouts: every claim once more, back to back, timed as a
    # whole, against the summed generation time of the same rollouts (a ratio of totals).
    torch.set_num_threads(all_cores)
    verdicts, t_stream = _timed(lambda: [verifier.verify(c) for c in claims])

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        **{key: median(key) for key in rows[0] if key != "accepted"},
        "stream_verify_s": t_stream / n_rollouts,
        "speedup_stream": sum(r["gen_best"] for r in rows) / t_stream,
        "accepted_stream": sum(v.accepted for v in verdicts),
        "accepted": sum(r["accepted"] for r in rows),
        "n": n_rollouts,
        "chunks": -(-completion // 32),
        "hidden": model.config.d_model,
    }


def bench_reference(python: str, reps: int) -> dict[str, float] | None:
    if not Path(python).exists():
        return None
    torch.manual_seed(1)
    act = torch.randn(256, 128).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        act_path, out_path = os.path.join(tmp, "act.pt"), os.path.join(tmp, "proofs.pt")
        torch.save(act, act_path)
        try:
            res = subprocess.run(
                [python, "-c", REFERENCE_SCRIPT, act_path, str(reps), out_path],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=tmp,
            )
        except (subprocess.TimeoutExpired, OSError) as e:
            print(f"reference toploc not usable: {e}")
            return None
        if res.returncode != 0:
            print(f"reference toploc not usable: {res.stderr.strip().splitlines()[-1:]}")
            return None
        ref_build, ref_verify = map(float, res.stdout.split()[-2:])
        ref_proofs = torch.load(out_path)
    build_proofs(act)
    ours, t_build = _timed(lambda: [build_proofs(act) for _ in range(reps)])
    _, t_verify = _timed(lambda: [verify_proofs(act, ours[0]) for _ in range(reps)])
    chunks = 8
    return {
        "ref_build_ms": ref_build / chunks * 1e3,
        "ref_verify_ms": ref_verify / chunks * 1e3,
        "our_build_ms": t_build / reps / chunks * 1e3,
        "our_verify_ms": t_verify / reps / chunks * 1e3,
        "identical": float(list(ref_proofs) == ours[0]),
    }


def calibrate(cases: int, completion: int) -> None:
    from protocol.errors import InvalidProofError
    from tests.helpers.scenarios import KINDS, Lab
    from verification.recompute import recompute
    from verification.rollout import CLAIM_DTYPES
    from verification.sampling_check import check_sampling

    lab = Lab(completion_tokens=completion)
    verifier = RolloutVerifier(lab.policy, lab.policy_version)
    names = ["exp", "sign", "mean", "median", "values", "gap"]
    print(f"\ncalibration: {cases} cases per kind, {completion}-token completions; worst chunk per rollout,")
    print("shown as [min, max] over rollouts (gap: largest per-token sampling gap, logits)")
    print(f"{'kind':22s} " + " ".join(f"{n:>14s}" for n in names) + "  malformed")
    for kind in KINDS:
        rows, malformed = [], 0
        for case in range(cases):
            claim = lab.build(kind, case).claim
            hidden, logits = recompute(claim, verifier.model_for(CLAIM_DTYPES[claim.dtype]))
            try:
                checks = verify_proofs(hidden.to(torch.bfloat16), claim.proofs)
            except InvalidProofError:
                malformed += 1
                continue
            s = check_sampling(
                logits, torch.tensor(claim.completion_ids), claim.sampling, claim.seed, abs_tol=0, rel_tol=0
            )
            rows.append(
                [
                    max(c.exp_mismatches for c in checks),
                    max(c.sign_mismatches for c in checks),
                    max(c.mant_err_mean for c in checks),
                    max(c.mant_err_median for c in checks),
                    max(c.value_mismatches for c in checks),
                    s.max_gap,
                ]
            )
        a = np.array(rows) if rows else np.zeros((0, len(names)))
        cells = [f"[{a[:, i].min():.3g},{a[:, i].max():.3g}]" if len(a) else "-" for i in range(len(names))]
        print(f"{kind:22s} " + " ".join(f"{c:>14s}" for c in cells) + f"  {malformed}/{cases}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rollouts (under 3 minutes)")
    ap.add_argument("--calibrate", action="store_true", help="also print the threshold calibration table")
    ap.add_argument("--reference-python", default="/tmp/toploc-ref/bin/python")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for 'all cores' (0 = torch's default, one per core)",
    )
    args = ap.parse_args()
    all_cores = args.threads or torch.get_num_threads()
    n = 3 if args.quick else 10
    completion = 256
    print(
        f"TinyGPT {ModelConfig().d_model}-wide bf16, {completion}-token completions, {n} rollouts; "
        f"'all cores' = {all_cores} torch threads"
    )
    r = bench_rollouts(n, completion, torch.bfloat16, all_cores)
    overhead = (r["gen_1"] - r["gen_plain"]) / r["gen_plain"]
    build_frac = r["proofs"] / r["gen_plain"]
    ms = 1e3
    print(f"{'generation, 1 thread, no proofs':44s} {r['gen_plain'] * ms:8.1f} ms")
    print(f"{'generation, 1 thread, inline proofs':44s} {r['gen_1'] * ms:8.1f} ms")
    print(
        f"{'generation, all cores, inline proofs':44s} {r['gen_all'] * ms:8.1f} ms"
        "   (token by token: threads do not help)"
    )
    print(
        f"{'proof building alone, 8 chunks':44s} {r['proofs'] * ms:8.2f} ms "
        f"= {build_frac:.2%} of generation (target < 2%)"
    )
    print(
        f"{'end-to-end difference (with - without)':44s} {overhead:8.2%}   (difference of two noisy timings)"
    )
    print(f"{'full verdict (prefill+proofs+sampling), 1 thread':44s} {r['ver_1'] * ms:8.1f} ms")
    print(f"{'full verdict, all cores':44s} {r['ver_all'] * ms:8.1f} ms   (the prefill parallelises)")
    print("verification speed-up, median over rollouts of generation time / verdict time:")
    print(
        f"{'  same machine (each side at its fastest)':44s} {r['speedup']:8.1f}x  (target >= 20x)  <- verify_speedup"
    )
    print(f"{'  one thread each (per core, i.e. throughput)':44s} {r['speedup_1t']:8.1f}x")
    print(
        f"{'  one thread each, in thread CPU time':44s} {r['speedup_cpu']:8.1f}x  (leaves out other processes)"
    )
    print(
        f"{'  same rollouts re-verified back to back':44s} {r['speedup_stream']:8.1f}x  (total / total, "
        f"{r['stream_verify_s'] * ms:.1f} ms each, {r['accepted_stream']}/{r['n']} accepted)"
    )
    print(f"{'honest rollouts accepted':44s} {int(r['accepted']):8d} / {r['n']}")
    raw = 32 * r["hidden"] * 2
    print(
        f"{'proof bytes per 32 tokens':44s} {258:8d}   raw bf16 activations {raw} B -> {raw / 258:.1f}x "
        f"(at hidden 4096: {32 * 4096 * 2 / 258:.0f}x)"
    )
    ref = bench_reference(args.reference_python, 5 if args.quick else 20)
    extra = ""
    if ref is None:
        print("reference toploc: not available (build it in a scratch venv, see --reference-python)")
    else:
        print(f"{'per chunk (32x128 bf16)':44s} {'build':>8s} {'verify':>9s}")
        print(
            f"{'  reference toploc 0.1.6 (C++)':44s} {ref['ref_build_ms']:7.3f}ms {ref['ref_verify_ms']:7.3f}ms"
        )
        print(
            f"{'  hivenet (numpy, vectorised)':44s} {ref['our_build_ms']:7.3f}ms {ref['our_verify_ms']:7.3f}ms"
        )
        print(f"{'  proofs byte-identical':44s} {bool(ref['identical'])}")
        extra = (
            f" ref_build_ms_per_chunk={ref['ref_build_ms']:.3f} our_build_ms_per_chunk={ref['our_build_ms']:.3f}"
            f" ref_verify_ms_per_chunk={ref['ref_verify_ms']:.3f}"
            f" our_verify_ms_per_chunk={ref['our_verify_ms']:.3f} ref_identical={int(ref['identical'])}"
        )
    if args.calibrate:
        calibrate(4 if args.quick else 16, 96)
    print(
        f"RESULT proof_overhead_frac={build_frac:.4f} verify_speedup={r['speedup']:.1f} "
        f"verify_speedup_1t={r['speedup_1t']:.1f} verify_speedup_cpu={r['speedup_cpu']:.1f} "
        f"verify_speedup_stream={r['speedup_stream']:.1f} proof_bytes=258 compression_ratio={raw / 258:.2f} "
        f"honest_accepted={int(r['accepted'])}/{r['n']} threads={all_cores}" + extra
    )


if __name__ == "__main__":
    main()
