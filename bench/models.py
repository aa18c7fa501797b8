"""Benchmark of generation through the model interface against transformers' own `generate`.

One `hivenet model init` model (float32 on CPU, one torch thread for both sides), the same
prompts and the same sampling (temperature 1, no top-k or top-p, no early stop), side by side:

1. `transformers`: `model.hf.generate(do_sample=True, ...)`, the baseline;
2. `interface`: `training.generation.generate(prove=False)`: the `CausalLM` interface's KV-cache
   decode with hivenet's seeded Gumbel-max sampler, keeping every final hidden state;
3. `with proofs`: the same with TOPLOC proofs built every 32 tokens (on a background thread).

Runs alternate between the three and each figure is the median of its runs, so that a slow
moment of this noisy machine hits them alike. Keys:

- `decode_speed_ratio` = interface tokens/s / transformers tokens/s (target >= 0.9);
- `proof_overhead_frac` = (time with proofs - time without) / time without (target < 0.02).

    python bench/models.py --quick   # the micro model, 2 rounds
    python bench/models.py           # the tiny model (pretrained and cached on first use), 5 rounds

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
from training.hf_model import HFCausalLM, load_hf_model  # noqa: E402
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


def _interface_generate(prove: bool) -> Callable[[HFCausalLM, list[list[int]], int], None]:
    def run(model: HFCausalLM, prompts: list[list[int]], new_tokens: int) -> None:
        for i, prompt in enumerate(prompts):
            generate(model, prompt, new_tokens, PARAMS, seed=i, prove=prove)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the micro model, 2 rounds (same keys)")
    parser.add_argument("--model", type=Path, help="a model directory to use instead of building one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds, prompts_per_round, new_tokens = (2, 4, 96) if args.quick else (5, 8, 160)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or init_model_dir(
            Path(scratch) / "model", size="micro" if args.quick else "tiny"
        )
        model = load_hf_model(model_dir)
        task = get_task("line-length", HFTokenizer(model_dir))
        prompts = [task.prompt(seed) for seed in range(prompts_per_round)]
        sides: dict[str, Callable[[HFCausalLM, list[list[int]], int], None]] = {
            "transformers": _transformers_generate,
            "interface": _interface_generate(prove=False),
            "with proofs": _interface_generate(prove=True),
        }
        with torch.inference_mode():
            _interface_generate(prove=True)(model, prompts[:1], 8)  # warm-up: thread pool, caches
            _transformers_generate(model, prompts[:1], 8)
            times: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(rounds):
                for name, run in sides.items():
                    start = time.perf_counter()
                    run(model, prompts, new_tokens)
                    times[name].append(time.perf_counter() - start)
    tokens = prompts_per_round * new_tokens
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{model.family} model, {model.num_parameters():,} parameters, {tokens} tokens a run, 1 thread")
    print(f"{'side':<14}{'tokens/s':>10}{'runs (s)':>30}")
    for name, values in times.items():
        print(f"{name:<14}{tokens / median[name]:>10.0f}{' '.join(f'{v:.2f}' for v in values):>30}")
    ratio = median["transformers"] / median["interface"]
    overhead = (median["with proofs"] - median["interface"]) / median["interface"]
    print(f"RESULT decode_speed_ratio={ratio:.3f} proof_overhead_frac={overhead:.4f}")


if __name__ == "__main__":
    main()
