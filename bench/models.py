"""Benchmark of generation through the model interface against transformers' own `generate`.

One `hivenet model init` model (float32 on CPU, one torch thread for both sides), the same
prompts and the same sampling (temperature 1, no top-k or top-p, no early stop), side by side:

1. `transformers`: `model.hf.generate(do_sample=True, ...)`, the baseline;
2. `interface`: `training.generation.generate(prove=False)`: the `CausalLM` interface's KV-cache
   decode with hivenet's seeded Gumbel-max sampler, keeping every final hidden state;
3. `with proofs`: the same with TOPLOC proofs built every 32 tokens, inline on the decoding
   thread as an inference worker builds them (so their whole cost is on that thread's clock).

Every side runs on this thread, and each run is timed by this thread's CPU clock
(`time.thread_time`), so other processes competing for this noisy machine's cores do not
decide the figures; wall time is printed beside it. Runs alternate between the three and each
figure is the median of its runs. Keys:

- `decode_speed_ratio` = interface tokens per CPU second / transformers' (target >= 0.9);
- `proof_overhead_frac` = the CPU time spent building proofs over the CPU time of the rest of the
  same runs (median over the runs with proofs; target < 0.02). The proof builder counts its own
  CPU time (`Generation.proof_cpu_seconds`), which is exact where the difference between
  separate runs with and without proofs is within this machine's run-to-run noise; that
  difference is printed too.

    python bench/models.py --quick   # the micro model, 6 rounds
    python bench/models.py           # the tiny model (pretrained and cached on first use), 8 rounds

Ends with one line `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from training.generation import generate  # noqa: E402
from training.hf_model import HFCausalLM, load_hf_model, quiet_transformers  # noqa: E402
from training.model_init import init_model_dir  # noqa: E402
from training.sampling import SamplingParams  # noqa: E402
from training.tasks import get_task  # noqa: E402
from training.tokenizer import HFTokenizer  # noqa: E402

PARAMS = SamplingParams(temperature=1.0, top_p=1.0)


def _transformers_generate(model: HFCausalLM, prompts: list[list[int]], new_tokens: int) -> None:
    for i, prompt in enumerate(prompts):
        torch.manual_seed(i)
        model.hf.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )


def _interface_generate(prove: bool) -> Callable[[HFCausalLM, list[list[int]], int], float]:
    """A run of the interface's generation; it returns the CPU seconds its proofs took."""

    def run(model: HFCausalLM, prompts: list[list[int]], new_tokens: int) -> float:
        return sum(
            generate(
                model, prompt, new_tokens, PARAMS, seed=i, prove=prove, background_proofs=False
            ).proof_cpu_seconds
            for i, prompt in enumerate(prompts)
        )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the micro model, 6 rounds (same keys)")
    parser.add_argument("--model", type=Path, help="a model directory to use instead of building one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    quiet_transformers()
    rounds, prompts_per_round, new_tokens = (6, 4, 96) if args.quick else (8, 8, 160)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or init_model_dir(
            Path(scratch) / "model", size="micro" if args.quick else "tiny"
        )
        model = load_hf_model(model_dir)
        task = get_task("line-length", HFTokenizer(model_dir))
        prompts = [task.prompt(seed) for seed in range(prompts_per_round)]
        sides: dict[str, Callable[[HFCausalLM, list[list[int]], int], object]] = {
            "transformers": _transformers_generate,
            "interface": _interface_generate(prove=False),
            "with proofs": _interface_generate(prove=True),
        }
        with torch.inference_mode():
            _interface_generate(prove=True)(model, prompts[:1], 8)  # warm-up: caches
            _transformers_generate(model, prompts[:1], 8)
            times: dict[str, list[float]] = {name: [] for name in sides}
            walls: dict[str, list[float]] = {name: [] for name in sides}
            proof_shares: list[float] = []
            for _ in range(rounds):
                for name, run in sides.items():
                    start, cpu_start = time.perf_counter(), time.thread_time()
                    proof_cpu = run(model, prompts, new_tokens)
                    times[name].append(time.thread_time() - cpu_start)
                    walls[name].append(time.perf_counter() - start)
                    if name == "with proofs":
                        assert isinstance(proof_cpu, float)
                        proof_shares.append(proof_cpu / (times[name][-1] - proof_cpu))
    tokens = prompts_per_round * new_tokens
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{model.family} model, {model.num_parameters():,} parameters, {tokens} tokens a run, 1 thread")
    print(f"{'side':<14}{'tokens/CPU s':>13}{'tokens/s (wall)':>17}   CPU s of each run")
    for name, values in times.items():
        wall = statistics.median(walls[name])
        print(
            f"{name:<14}{tokens / median[name]:>13.0f}{tokens / wall:>17.0f}   {' '.join(f'{v:.2f}' for v in values)}"
        )
    ratio = median["transformers"] / median["interface"]
    overhead = statistics.median(proof_shares)
    by_difference = (median["with proofs"] - median["interface"]) / median["interface"]
    print(
        f"proofs: {overhead:.2%} of the decode's CPU time, counted inside each run "
        f"(by the difference of the medians above, which this machine's noise swamps: {by_difference:+.2%})"
    )
    print(f"RESULT decode_speed_ratio={ratio:.3f} proof_overhead_frac={overhead:.4f}")


if __name__ == "__main__":
    main()
