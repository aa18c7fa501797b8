"""Benchmark of the decentralized RL loop against a synchronous single-process GRPO loop.

Side by side in one run, same task, seeds and hyper-parameters, starting from the same briefly
pretrained policy:

1. the synchronous baseline (`training.rl_sync.run_sync_grpo`): generate, score, step, in one
   process, K steps;
2. the swarm (`verification.rl_simulation.simulate_rl`): a seed, a trainer with its validator and
   one honest inference worker on 127.0.0.1, async level k, K trainer steps;
3. the same swarm with the honest worker joined by one dishonest worker of each kind
   (precision swap, other weights);
4. the worker's generation loop alone: the same number of rollouts generated in this process
   with no network, no proofs and no verification;
5. a grinder (`training.rl_grinder`) beside an honest worker: it generates each ticket under every
   version it holds, submits the best and drops what scores below its median;
   `grinder_reward_advantage` is the reward credited for its accepted rollouts over what an honest
   worker's rollouts of the same tickets earn, paired rollout by rollout, minus 1 (target
   |x| <= 0.02), `grinder_selection_gain` what the choice of which tickets got credited (its
   drops, its bans) changed (a mean over few tickets: noisy), and `grinder_accepted_vs_honest`
   its accepted rollouts over the honest worker's beside it, with its abandoned tickets and bans;
6. one judged group submitted again to a second validator, re-encoded, and after a restart
   (`bench/_rl_replay.py`): `replayed_groups_credited`, target 0;
7. two credited workers signing verdicts and training receipts for each other and a sybil
   (`bench/_rl_collusion.py`): `sybil_credit` and `collusion_gain`, both targets 0.

Both runs' final policies are scored on the same held-out prompts and sampling seeds, so
`reward_gain_ratio = (R_swarm - R0) / (R_sync - R0)`. `throughput_ratio` is the honest worker's
verified share of what a plain generation loop would make of the same CPU time: the part of its
CPU time spent decoding alone (proofs, serialisation, sealing excluded; the worker counts it),
times the share of its rollouts that were verified. It is measured inside the run because a
separate plain loop (4., printed beside it) runs the initial policy, whose completions differ in
length from those of the policy the swarm trains, which changes the cost per rollout and per
token alike. CPU figures use thread CPU clocks, so the
trainer and validator sharing the machine's cores with the worker do not decide them.

    python bench/rl.py --quick   # K = 6 steps
    python bench/rl.py           # K = 30 steps
    python bench/rl.py --lr 1e-3 # both loops at another GRPO learning rate
    python bench/rl.py --model hf --quick   # the same on a `hivenet model init` llama (float32, native
                                            # kernels; the micro size with --quick, tiny otherwise), under
                                            # limits calibrated on it first (`calibrated_config`)

The first run also pretrains the policy and caches it; after that, on 2 cores, `--quick` takes
about 35 s and the full run about 100 s. With K = 6 the sync loop's gain is small and noisy, so
`reward_gain_ratio` of a quick run says little; read the full run's. At the default learning rate
the synchronous loop is unstable (it collapses to no reward for some seeds) where the swarm's
off-policy clipping is not, which inflates the ratio; `--lr 1e-3` compares two stable loops.

Ends with one line `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._model_choice import add_model_option, chosen_model  # noqa: E402
from bench._rl_collusion import run_collusion  # noqa: E402
from bench._rl_replay import run_replay  # noqa: E402
from protocol.assignment import derive_assignment  # noqa: E402
from training.causal_lm import CausalLM  # noqa: E402
from training.generation import generate  # noqa: E402
from training.grpo import GRPOConfig  # noqa: E402
from training.rl_run import RLRunConfig, initial_policy, run_task  # noqa: E402
from training.rl_sync import run_sync_grpo  # noqa: E402
from training.rl_worker import CheatMode  # noqa: E402
from training.tasks import Task  # noqa: E402
from verification.calibration import CalibrationPlan  # noqa: E402
from verification.calibration_setup import calibrated_config  # noqa: E402
from verification.rl_simulation import RLSimulation, simulate_rl  # noqa: E402

EVAL_PROMPTS = 192
SEED = 1234


def evaluate(model: CausalLM, task: Task, config: GRPOConfig) -> float:
    """Mean reward of `model` on fixed held-out prompts and sampling seeds (one completion each)."""
    rewards = []
    for i in range(EVAL_PROMPTS):
        assignment = derive_assignment("bench-eval", 0, b"evaluator", i, 1, nonce=b"")
        prompt = task.prompt(assignment.prompt_seed)
        out = generate(
            model, prompt, task.max_new_tokens, config.sampling, assignment.sampling_seeds[0],
            stop_ids=task.stop_ids, prove=False,
        )  # fmt: skip
        rewards.append(task.reward(prompt, out.completion_ids))
    return statistics.fmean(rewards)


def plain_generation(model: CausalLM, task: Task, config: GRPOConfig, rollouts: int) -> tuple[float, float]:
    """Rollouts and completion tokens per thread CPU-second of the bare generation loop (no network,
    proofs or checks)."""
    started = time.thread_time()
    done = tokens = 0
    counter = 0
    while done < rollouts:
        assignment = derive_assignment("bench-plain", 0, b"plain", counter, config.group_size, nonce=b"")
        prompt = task.prompt(assignment.prompt_seed)
        for seed in assignment.sampling_seeds:
            out = generate(
                model,
                prompt,
                task.max_new_tokens,
                config.sampling,
                seed,
                stop_ids=task.stop_ids,
                prove=False,
            )
            done += 1
            tokens += len(out.completion_ids)
        counter += 1
    seconds = time.thread_time() - started
    return done / seconds, tokens / seconds


def swarm_run(
    config: RLRunConfig, policy: CausalLM, cheaters: dict[int, CheatMode], workers: int
) -> RLSimulation:
    return simulate_rl(config, copy.deepcopy(policy), workers=workers, cheaters=cheaters)


GRIND_STEPS = 30
GRIND_GRACE_S = 15.0
"""How long the grinder's run keeps a ticket whose version is too old open (the run's default, 120 s,
is longer than the whole benchmark run)."""


def grinder_figures(run: RLSimulation, name: str) -> dict[str, str]:
    """The grinder's gain, paired rollout by rollout: the reward credited for each of its accepted
    rollouts against the reward of the rollout an honest worker would have submitted for the same
    ticket and index (the ticket version's group), summed over its accepted rollouts, minus 1. Which
    tickets got credited at all (it dropped some, it was banned) is the selection figure beside it."""
    records = {r.counter: r for r in run.grind_records.get(name, [])}
    accepted = run.accepted_rewards.get(name, {})
    paired = [(got, records[c].honest_rewards[i]) for (c, i), got in accepted.items() if c in records]
    credited, honest_same = sum(got for got, _ in paired), sum(honest for _, honest in paired)
    advantage = credited / honest_same - 1 if paired and honest_same > 0 else float("nan")
    everything = [value for r in records.values() for value in r.honest_rewards]
    honest_all = statistics.fmean(everything) if everything else float("nan")
    selection = honest_same / len(paired) / honest_all - 1 if paired and honest_all > 0 else float("nan")
    stats = run.validator_stats.workers.get(run.worker_peers[name]) if run.validator_stats else None
    honest_accepted = sum(n for worker, n in run.accepted.items() if worker != name)
    credited_frac = len(paired) / honest_accepted if honest_accepted else float("nan")
    dropped = sum(r.submitted_version is None for r in records.values())
    other = sum(r.submitted_version not in (None, r.ticket_version) for r in records.values())
    print(f"grinder: {len(records)} tickets, {dropped} dropped, {other} submitted with another version than the "
          f"ticket's; accepted {len(paired)} rollouts: reward {credited:.2f} credited vs {honest_same:.2f} for the "
          f"same tickets' honest rollouts; their honest mean {honest_same / max(1, len(paired)):.3f} vs "
          f"{honest_all:.3f} over all its tickets (selection, {len(everything)} rollouts); accepted "
          f"{credited_frac:.2f}x the honest worker's rollouts; "
          f"validator: {stats.describe() if stats else '-'}")  # fmt: skip
    return {
        "grinder_reward_advantage": f"{advantage:.3f}",
        "grinder_selection_gain": f"{selection:.3f}",
        "grinder_accepted_vs_honest": f"{credited_frac:.3f}",
        "grinder_tickets": str(len(records)),
        "grinder_accepted_rollouts": str(len(paired)),
        "grinder_abandoned": str(stats.abandoned if stats else 0),
        "grinder_banned": str(stats.strikes if stats else 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="K = 6 steps (same keys)")
    parser.add_argument("--steps", type=int, help="trainer steps K (default: 30, quick: 6)")
    parser.add_argument("--async-level", type=int, default=2)
    add_model_option(parser)
    parser.add_argument(
        "--lr", type=float, help="GRPO learning rate of both runs (default: the run's default)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    steps = args.steps or (6 if args.quick else 30)
    base = RLRunConfig(run_id="bench-rl", max_trainer_steps=steps)
    grpo = base.grpo.model_copy(update={"async_level": args.async_level, "lr": args.lr or base.grpo.lr})
    scratch = tempfile.TemporaryDirectory()
    hf_model = chosen_model(args.model, quick=args.quick, scratch=Path(scratch.name))
    config = base.model_copy(update={"grpo": grpo, "hf_model": hf_model})
    if hf_model is not None:  # native kernels: the run's limits are calibrated on its model first
        plan = CalibrationPlan(
            honest_rollouts=128 if args.quick else 512, cheat_rollouts=8 if args.quick else 32
        )
        config = calibrated_config(config, plan)
    task = run_task(config)
    policy = initial_policy(config)
    r0 = evaluate(policy, task, grpo)

    started = time.monotonic()
    sync_model = copy.deepcopy(policy)
    sync_curve = run_sync_grpo(task, grpo, steps, SEED, sync_model)
    r_sync = evaluate(sync_model, task, grpo)
    sync_s = time.monotonic() - started

    started = time.monotonic()
    honest = swarm_run(config, policy, {}, workers=1)
    swarm_model = copy.deepcopy(policy)
    swarm_model.load_state_dict(honest.final_state)
    r_swarm = evaluate(swarm_model, task, grpo)
    swarm_s = time.monotonic() - started

    cheat_steps = 2 if args.quick else max(2, steps // 2)
    cheat_config = config.model_copy(update={"max_trainer_steps": cheat_steps})
    cheating = swarm_run(cheat_config, policy, {1: CheatMode.PRECISION, 2: CheatMode.WEIGHTS}, workers=3)
    # long enough, and tickets expiring soon enough, that what the grinder drops is counted abandoned
    grind_config = config.model_copy(
        update={"max_trainer_steps": max(steps, GRIND_STEPS), "submit_timeout_s": GRIND_GRACE_S}
    )
    grinding = swarm_run(grind_config, policy, {1: CheatMode.GRINDER}, workers=2)

    generated = sum(len(g) * grpo.group_size for g in honest.groups.values())
    stale = honest.stale_dropped + honest.rejected_by_reason.get("stale", 0)
    worker_cpu = honest.worker_cpu_seconds["worker0"]
    worker_groups = honest.groups["worker0"]
    verified_tokens = sum(g.tokens * g.accepted / grpo.group_size for g in worker_groups)
    verified_tokens_per_cpu_s = verified_tokens / worker_cpu if worker_cpu > 0 else 0.0
    decode_share = honest.worker_decode_cpu_seconds["worker0"] / worker_cpu if worker_cpu > 0 else 0.0
    throughput = decode_share * honest.accepted["worker0"] / generated if generated else 0.0
    plain_per_cpu_s, plain_tokens_per_cpu_s = plain_generation(policy, task, grpo, max(32, generated // 2))
    cheater_trained = sum(cheating.trained_from.get(name, 0) for name in cheating.cheaters)
    honest_rejected = sum(
        sum(sum(g.rejected.values()) for g in groups)
        for name, groups in {**honest.groups, **cheating.groups}.items()
        if name not in cheating.cheaters
    )

    print(f"{'step':>4} {'sync reward':>12} {'swarm reward':>13}")
    swarm_curve = [s.mean_reward for s in honest.steps]
    for i in range(steps):
        sync_r = f"{sync_curve[i]:.3f}" if i < len(sync_curve) else "-"
        swarm_r = f"{swarm_curve[i]:.3f}" if i < len(swarm_curve) else "-"
        print(f"{i:>4} {sync_r:>12} {swarm_r:>13}")
    print(f"held-out reward: initial {r0:.3f}, sync after {steps} steps {r_sync:.3f} ({sync_s:.0f} s), "
          f"swarm {r_swarm:.3f} ({swarm_s:.0f} s)")  # fmt: skip
    print(f"worker: {generated} rollouts generated, {honest.accepted['worker0']} verified, {worker_cpu:.1f} CPU s "
          f"({decode_share:.1%} of it decoding); "
          f"{verified_tokens_per_cpu_s:.0f} verified tokens/CPU s; plain loop {plain_per_cpu_s:.2f} rollouts/CPU s, "
          f"{plain_tokens_per_cpu_s:.0f} tokens/CPU s; validator {honest.validator_cpu_seconds:.1f} CPU s")  # fmt: skip
    worker_tokens = sum(g.tokens for g in worker_groups)
    judged_groups = honest.validator_rollouts_judged / grpo.group_size
    if worker_groups and judged_groups:
        print(f"per group: worker {worker_cpu / len(worker_groups) * 1e3:.1f} CPU ms "
              f"({worker_tokens / len(worker_groups):.0f} tokens, {len(worker_groups)} groups), "
              f"validator {honest.validator_cpu_seconds / judged_groups * 1e3:.2f} CPU ms "
              f"({judged_groups:.0f} groups judged in {len(honest.validator_batches)} batches)")  # fmt: skip
    for name, mode in cheating.cheaters.items():
        stats = cheating.validator_stats
        view = stats.describe_worker(cheating.worker_peers[name]) if stats is not None else "-"
        print(f"cheater {name} ({mode}): trained on {cheating.trained_from.get(name, 0)}; validator: {view}")

    grind = grinder_figures(grinding, "worker1")

    gain_sync = r_sync - r0
    fields = {
        "reward_gain_ratio": f"{(r_swarm - r0) / gain_sync:.3f}" if abs(gain_sync) > 1e-9 else "nan",
        "stale_waste_frac": f"{stale / generated:.4f}" if generated else "nan",
        "throughput_ratio": f"{throughput:.3f}",
        "verify_cost_frac": f"{honest.validator_cpu_seconds / worker_cpu:.4f}" if worker_cpu > 0 else "nan",
        "cheater_rollouts_trained": cheater_trained,
        "honest_rejected": honest_rejected,
        "weight_pickup_s": f"{statistics.median(honest.pickup_s):.2f}" if honest.pickup_s else "nan",
        "steps": steps,
        "async_level": args.async_level,
        "lr": grpo.lr,
        "reward_initial": f"{r0:.3f}",
        "reward_sync": f"{r_sync:.3f}",
        "reward_swarm": f"{r_swarm:.3f}",
        **grind,
        **run_replay(),
        **run_collusion(),
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
