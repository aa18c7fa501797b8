"""Benchmark of robustness: robust aggregation under attack, then attacks on a live swarm.

Part 1, robust aggregation: DiLoCo with 2 of 8 trainers attacking, robust rule vs plain mean.

Eight `training.diloco.DiLoCoTrainer`s run in one process (threads in lockstep, no network,
overlap off so that every run is deterministic), same seeds and data shards in every run.
Each round the eight pseudo-gradients go through the reducers' arithmetic of the real
all-reduce: the flat vector is cut into eight contiguous slices (one per reducer, as
`TensorPartContainer` does for a model this small), a sender's slice whose norm is above the
reducer's bound is refused (`node.averaging.runner.norm_bound`, 10x), and each slice is
combined with `node.averaging.robust.aggregate`, the function the reducer calls. Trainers 6
and 7 replace their pseudo-gradient by an attack (`tests.helpers.attacks`: sign flip and
scaled at 9x their own norm, random noise of that norm, ALIE); the reducers stay honest.

Reported: the final held-out loss of each attacked run over the clean run with the plain
mean (`loss_ratio_<attack>_<rule>`; target <= 1.05 for the robust rule) and the clean run
with the robust rule over the clean mean (`loss_ratio_clean_robust`; target <= 1.01).

Part 2, attacks on 127.0.0.1 from plain hivemind clients (`bench/_robustness_attacks.py`, with
the scenarios of the tests): squatting the run's DHT keys (`squat_attacks_survived=N/N`: the
squat is refused and the honest operation still works, for the weights pointer, a version's
holders, the node records, an outer step's matchmaking key, `.all_averagers`, declarations
forged in a trainer's name, and 64 values of 1 MiB at one node), two identities holding every
upload stream of a publisher while an honest node fetches (`upload_slot_squat_fetch=ok`: the
fetch completes), a joiner resyncing while an attacker serves poisoned state
(`poisoned_state_accepted`, a count; target 0) and a 2^40-byte declared averager message
(`averager_rss_growth_mib`, the averager process's RSS growth; target <= 16). Part 2 is the same
with and without `--quick` (about a minute).

Part 3, a flood of genuine receipts from fresh identities through a node's pull path
(`bench/_receipt_flood.py`): the ledger's growth over 10 minutes of it (one with `--quick`) with
the run's signers known (`junk_receipts_stored_mib`, target <= 16) and without
(`junk_receipts_unfiltered_mib`), and whether honest receipts still get in after it.

Part 4, floods of valid DHT records from fresh identities (`bench/_dht_flood.py`): the growth of
a DHT node's memory under 100,000 records (20,000 with `--quick`; `dht_flood_rss_growth_mib`,
target <= 64), and whether a newcomer still lists a run's honest nodes with 1,100 and 10,000 sybil
records stored under the run's key (`subkey_flood_nodes_listed_frac`, target 1).

Part 5, a flood of outer-state downloads (`bench/_state_flood.py`): two gather trainers train while
4 fresh identities with 4 download streams each ask one of them for its state without pause, in
phases alternating with clean ones. Reported: the victim's median inner-step time flooded over
clean (`flood_step_slowdown`, target <= 0.05), the state bytes it uploaded per second of flood
(`flood_upload_mb_per_s`) and the requests it refused (`flood_refusals`). About 30 s with `--quick`.

    python bench/robustness.py --quick   # 10 outer steps of H=20 + part 2 (under 2 minutes on 2 cores)
    python bench/robustness.py           # 30 outer steps of H=50 (~15 minutes on 2 cores) + part 2

Ends with one line `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._dht_flood import run_dht_floods  # noqa: E402
from bench._receipt_flood import run_receipt_flood  # noqa: E402
from bench._robustness_attacks import run_attacks  # noqa: E402
from bench._state_flood import run_state_flood  # noqa: E402
from node.averaging.robust import DEFAULT_RULE, AggregationRule, aggregate  # noqa: E402
from node.averaging.rounds import RoundOutcome  # noqa: E402
from node.averaging.runner import global_norm, norm_bound  # noqa: E402
from tests.helpers.attacks import ATTACKS, attack_inputs  # noqa: E402
from training.data import DataConfig, load_corpus  # noqa: E402
from training.diloco import DiLoCoConfig, DiLoCoTrainer  # noqa: E402
from training.model import ModelConfig, TinyGPT  # noqa: E402

NUM_TRAINERS = 8
ATTACKERS = (6, 7)
MAX_NORM_RATIO, MIN_NORM_PER_VALUE = 10.0, 1e-4  # the averager's defaults


class LockstepGroup:
    """The eight trainers' round: collects all pseudo-gradients, attacks, aggregates once, shares the result."""

    def __init__(self, rule: AggregationRule, attack: str | None) -> None:
        self.rule, self.attack = rule, attack
        self.cond = threading.Condition()
        self.inputs: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.results: dict[int, list[torch.Tensor]] = {}
        self.last_norm = 0.0
        self.refused = 0

    def member(self, index: int) -> Member:
        return Member(self, index)

    def submit(self, index: int, step: int, grads: Sequence[torch.Tensor]) -> None:
        with self.cond:
            self.inputs.setdefault(step, {})[index] = [g.clone() for g in grads]
            if len(self.inputs[step]) == NUM_TRAINERS:
                self.results[step] = self._reduce(step, self.inputs.pop(step))
                self.cond.notify_all()

    def result(self, step: int) -> list[torch.Tensor]:
        with self.cond:
            self.cond.wait_for(lambda: step in self.results)
            return [t.clone() for t in self.results[step]]

    def _reduce(self, step: int, by_index: dict[int, list[torch.Tensor]]) -> list[torch.Tensor]:
        shapes = [g.shape for g in by_index[0]]
        flat = torch.stack([torch.cat([g.reshape(-1) for g in by_index[i]]) for i in range(NUM_TRAINERS)])
        own_norms = [global_norm(by_index[i]) for i in range(NUM_TRAINERS)]
        if self.attack is not None:
            honest = flat[[i for i in range(NUM_TRAINERS) if i not in ATTACKERS]]
            gen = torch.Generator().manual_seed(1000 + step)
            flat[list(ATTACKERS)] = attack_inputs(self.attack, honest, flat[list(ATTACKERS)], gen)
        slices = torch.arange(flat.shape[1]).tensor_split(NUM_TRAINERS)
        averaged = torch.empty(flat.shape[1])
        for reducer, columns in enumerate(slices):
            parts = flat[:, columns]
            expected = max(own_norms[reducer], self.last_norm)
            own_part = (
                parts[reducer] if reducer not in ATTACKERS else flat_honest_part(by_index, reducer, columns)
            )
            bound = norm_bound(own_part, expected, flat.shape[1], MAX_NORM_RATIO, MIN_NORM_PER_VALUE)
            accepted = parts.norm(dim=1) <= bound
            self.refused += int((~accepted).sum())
            averaged[columns] = aggregate(self.rule, parts[accepted])
        self.last_norm = float(averaged.norm())
        out, offset = [], 0
        for shape in shapes:
            numel = shape.numel()
            out.append(averaged[offset : offset + numel].reshape(shape).clone())
            offset += numel
        return out


def flat_honest_part(
    by_index: dict[int, list[torch.Tensor]], index: int, columns: torch.Tensor
) -> torch.Tensor:
    """An attacking reducer's own honest slice: reducers are honest here, they bound parts by it."""
    return torch.cat([g.reshape(-1) for g in by_index[index]])[columns]


class Member:
    """One trainer's `RoundAverager` in the lockstep group."""

    def __init__(self, group: LockstepGroup, index: int) -> None:
        self.group, self.index = group, index

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> Round:
        self.group.submit(self.index, step, pseudo_grads)
        return Round(self.group, step)

    def bytes_sent(self) -> int:
        return 0


class Round:
    def __init__(self, group: LockstepGroup, step: int) -> None:
        self.group, self.step = group, step

    def done(self) -> bool:
        with self.group.cond:
            return self.step in self.group.results

    def result(self) -> RoundOutcome:
        return RoundOutcome(averaged=self.group.result(self.step), num_peers=NUM_TRAINERS)


def run(args: argparse.Namespace, rule: AggregationRule, attack: str | None) -> float:
    """Final held-out loss of one lockstep run (the outer parameters every trainer holds)."""
    model_config = ModelConfig(d_model=32, n_layers=1, n_heads=4, max_seq_len=32)
    corpus = load_corpus(DataConfig(seq_len=32, batch_size=args.batch_size, block_bytes=512, seed=0))
    eval_batches = corpus.eval_batches(args.eval_batches)
    config = DiLoCoConfig(
        inner_steps=args.inner_steps,
        max_outer_steps=args.outer_steps,
        inner_warmup_steps=min(50, args.inner_steps * args.outer_steps // 10),
        outer_lr=0.7,
        outer_momentum=0.8,
        eval_every_outer_steps=args.outer_steps,
        overlap_communication=False,
    )
    group = LockstepGroup(rule, attack)
    trainers = []
    for i in range(NUM_TRAINERS):
        torch.manual_seed(0)  # the same initial weights on every trainer
        sampler = corpus.sampler(i, NUM_TRAINERS)
        trainers.append(
            DiLoCoTrainer(
                TinyGPT(model_config),
                config,
                next_batch=sampler.next_batch,
                averager=group.member(i),
                eval_batches=eval_batches if i == 0 else (),
                name=f"trainer{i}",
            )
        )
    losses: list[float] = []

    def work(trainer: DiLoCoTrainer) -> None:
        reports = trainer.run(threading.Event())
        if trainer.name == "trainer0":
            losses.extend(r.eval_loss for r in reports if r.eval_loss is not None)

    threads = [threading.Thread(target=work, args=(t,)) for t in trainers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not losses:
        raise RuntimeError("trainer0 reported no held-out loss")
    hashes = {t.state.hash() for t in trainers}
    if len(hashes) != 1:
        raise RuntimeError("trainers ended with different outer states")
    if group.refused:
        print(f"    ({group.refused} slices refused by the norm bound)", flush=True)
    return losses[-1]


def _one_torch_thread() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)


def _timed_run(args: argparse.Namespace, rule: AggregationRule, attack: str | None) -> tuple[float, float]:
    started = time.perf_counter()
    return run(args, rule, attack), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small run, under 3 minutes")
    parser.add_argument(
        "--rule", default=DEFAULT_RULE, help=f"robust rule to compare with the mean ({DEFAULT_RULE})"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval-batches", type=int, default=32)
    parser.add_argument(
        "--processes",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="part 1 runs side by side (default 2)",
    )
    args = parser.parse_args()
    args.inner_steps = 20 if args.quick else 50
    args.outer_steps = 10 if args.quick else 30
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    print(
        f"{NUM_TRAINERS} trainers, attackers {ATTACKERS}, H={args.inner_steps}, {args.outer_steps} outer steps"
    )
    start = time.perf_counter()
    configs = [
        (attack, label, rule)
        for attack in (None, *ATTACKS)
        for label, rule in (("mean", "mean"), ("robust", args.rule))
    ]
    losses: dict[tuple[str, str], float] = {}
    # the runs are independent and deterministic, and each holds the GIL most of the time (a tiny
    # model): one process per core runs them side by side with the same results
    with multiprocessing.get_context("spawn").Pool(args.processes, initializer=_one_torch_thread) as pool:
        timed = pool.starmap(_timed_run, [(args, rule, attack) for attack, _, rule in configs])
    for (attack, label, _), (loss, seconds) in zip(configs, timed, strict=True):
        losses[(attack or "clean", label)] = loss
        print(f"  {attack or 'clean':<10}{label:<8}loss {loss:.4f}  ({seconds:.0f} s)", flush=True)
    clean = losses[("clean", "mean")]
    fields = {
        "loss_clean_mean": f"{clean:.4f}",
        "loss_ratio_clean_robust": f"{losses[('clean', 'robust')] / clean:.4f}",
    }
    print(f"\n{'attack':<12}{'mean':>10}{'robust':>10}   (final held-out loss / clean run with the mean)")
    for attack in ("clean", *ATTACKS):
        ratios = {label: losses[(attack, label)] / clean for label in ("mean", "robust")}
        print(f"{attack:<12}{ratios['mean']:>10.4f}{ratios['robust']:>10.4f}")
        if attack != "clean":
            fields[f"loss_ratio_{attack}_robust"] = f"{ratios['robust']:.4f}"
            fields[f"loss_ratio_{attack}_mean"] = f"{ratios['mean']:.4f}"
    fields.update(run_attacks())
    fields.update(run_receipt_flood(quick=args.quick))
    fields.update(run_dht_floods(quick=args.quick))
    fields.update(run_state_flood(quick=args.quick))
    fields.update(rule=args.rule, H=str(args.inner_steps), outer_steps=str(args.outer_steps),
                  wall_s=f"{time.perf_counter() - start:.0f}")  # fmt: skip
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
