"""Benchmark of robustness: robust aggregation under attack, then attacks on a live swarm.

Part 1, robust aggregation: DiLoCo with 2 of 8 trainers attacking, robust rule vs plain mean.

Eight `training.diloco.DiLoCoTrainer`s run in one process (threads in lockstep, no network,
overlap off so that every run is deterministic), same seeds and data shards in every run.
Each round the eight contributions go through the arithmetic every member of a round of the
node's averaging service runs (`node.collective`): each honest trainer encodes its
pseudo-gradient with its own codec (`--compression`, int8 or the sparse codec with its error
feedback; `codec_for`) and the round decodes every payload; then
`node.collective.aggregate.aggregate_contributions` refuses a whole contribution whose norm is
above `max_norm_ratio` (10, the trainer's default) times the median norm of the round's
contributions (floor `min_norm`, 0 as for a language-model trainer) and combines the rest with
the rule. Trainers 6 and 7 replace their pseudo-gradient by an attack (`tests.helpers.attacks`:
sign flip and scaled at 9x their own norm, random noise of that norm, ALIE), computed from the
honest members' decoded contributions and their own pseudo-gradient, and sent as a valid
payload of the same codec (encoded without error feedback).

Reported: the final held-out loss of each attacked run over the clean run with the plain
mean (`loss_ratio_<attack>_<rule>`; target <= 1.05 for the robust rule) and the clean run
with the robust rule over the clean mean (`loss_ratio_clean_robust`; target <= 1.01).

Part 2, attacks on 127.0.0.1 from plain hivemind clients (`bench/_robustness_attacks.py`, with
the scenarios of the tests): squatting the run's DHT keys (`squat_attacks_survived=N/N`: the
squat is refused and the honest operation still works, for the weights pointer, a version's
holders, the node records, the key where the run's trainers declare their averaging rounds,
unsigned declarations forged in a trainer's name, and 64 values of 1 MiB at one node), two
identities holding every upload stream of a publisher while an honest node fetches
(`upload_slot_squat_fetch=ok`: the fetch completes), a joiner resyncing while an attacker
serves poisoned state (`poisoned_state_accepted`, a count; target 0) and a frame declared at
4 GiB streamed into a trainer's averaging service (`averager_rss_growth_mib`, the RSS growth of
the process hosting it; target <= 16). Part 2 is the same with and without `--quick` (about a
minute).

Part 3, a flood of genuine receipts from fresh identities through a node's pull path
(`bench/_receipt_flood.py`): the ledger's growth over 10 minutes of it (one with `--quick`) with
the run's signers known (`junk_receipts_stored_mib`, target <= 16) and without
(`junk_receipts_unfiltered_mib`), and whether honest receipts still get in after it.

Part 4, floods of valid DHT records from fresh identities (`bench/_dht_flood.py`): the growth of
a DHT node's memory under 100,000 records (20,000 with `--quick`; `dht_flood_rss_growth_mib`,
target <= 64), and whether a newcomer still lists a run's honest nodes with 1,100 and 10,000 sybil
records stored under the run's key (`subkey_flood_nodes_listed_frac`, target 1), and whether two
trainers still average with each other under 1,100 valid round declarations from sybils with no host
behind them (`declaration_flood_rounds_averaged`, target 2/2; each flooded round's time over a clean
one's, `declaration_flood_round_ratio` and, the same sybils declaring again,
`declaration_flood_next_round_ratio`).

Part 5, a flood of outer-state downloads (`bench/_state_flood.py`): two gather trainers train while
4 fresh identities with 4 download streams each ask one of them for its state without pause, in
phases alternating with clean ones. Reported: the victim's median inner-step time flooded over
clean (`flood_step_slowdown`, target <= 0.05), the state bytes it uploaded per second of flood
(`flood_upload_mb_per_s`) and the requests it refused (`flood_refusals`); the attackers run on cores
of their own (`flood_cpus`), as they would on other machines. About 30 s with `--quick`.

Part 6, free identities and hostile strings (`bench/_sybil_attacks.py`): how many honest trainers
take a poisoned state that fresh identities agree on, running gather trainers and DiLoCo and RL
resyncs (`sybil_state_accepted`, target 0), and how many hostile verdict strings (markup, escapes,
control characters, huge) break an inference worker's reporting path or reach its terminal as
escapes (`worker_killed_by_string`, target 0). Under a minute.

    python bench/robustness.py --quick   # 10 outer steps of H=20 + part 2 (under 2 minutes on 2 cores)
    python bench/robustness.py           # 30 outer steps of H=50 (~15 minutes on 2 cores) + part 2
    python bench/robustness.py --quick --compression sparse   # part 1's contributions through the sparse codec

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
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._dht_flood import run_dht_floods  # noqa: E402
from bench._receipt_flood import run_receipt_flood  # noqa: E402
from bench._robustness_attacks import run_attacks  # noqa: E402
from bench._state_flood import run_state_flood  # noqa: E402
from bench._sybil_attacks import run_sybil_attacks  # noqa: E402
from node.collective.aggregate import aggregate_contributions  # noqa: E402
from node.collective.codecs import PseudoGradCodec, codec_for  # noqa: E402
from node.collective.config import AveragingConfig  # noqa: E402
from node.collective.round_types import RoundOutcome  # noqa: E402
from node.collective.rules import AGGREGATION_RULES, DEFAULT_RULE, AggregationRule  # noqa: E402
from tests.helpers.attacks import ATTACKS, attack_inputs  # noqa: E402
from training.data import DataConfig, load_corpus  # noqa: E402
from training.diloco import DiLoCoConfig, DiLoCoTrainer  # noqa: E402
from training.model import ModelConfig, TinyGPT  # noqa: E402
from training.trainer import TrainerConfig  # noqa: E402

NUM_TRAINERS = 8
ATTACKERS = (6, 7)
MAX_NORM_RATIO = TrainerConfig().max_norm_ratio
"""The norm cap's multiple of the round's median norm, as a trainer's averager has it by default."""
MIN_NORM_PER_VALUE = AveragingConfig().min_norm_per_value
"""The cap's floor per value: `training.averagers.make_averager` leaves it at this default (0)."""

Compression = Literal["int8", "sparse"]


class Codecs:
    """The codec settings of one run: each trainer's own encoder (error feedback is per trainer) and
    a decoder (decoding is pure)."""

    def __init__(self, name: Compression, density: float, chunk_values: int) -> None:
        self.name, self.density, self.chunk_values = name, density, chunk_values

    def make(self, shapes: Sequence[torch.Size], *, error_feedback: bool = True) -> PseudoGradCodec:
        return codec_for(
            self.name,
            shapes,
            density=self.density,
            chunk_values=self.chunk_values,
            error_feedback=error_feedback,
        )


class LockstepGroup:
    """The eight trainers' round: collects all contributions, attacks, aggregates once, shares the result."""

    def __init__(self, rule: AggregationRule, attack: str | None, codecs: Codecs) -> None:
        self.rule, self.attack, self.codecs = rule, attack, codecs
        self.cond = threading.Condition()
        self.inputs: dict[int, dict[int, tuple[list[torch.Tensor], bytes]]] = {}
        self.results: dict[int, list[torch.Tensor]] = {}
        self.refused = 0
        self.refused_by_step: dict[int, int] = {}
        self.error: BaseException | None = None
        """What went wrong in a round, if anything: every trainer gets it instead of waiting forever."""

    def member(self, index: int, shapes: Sequence[torch.Size]) -> Member:
        return Member(self, index, self.codecs.make(shapes))

    def submit(self, index: int, step: int, grads: Sequence[torch.Tensor], payload: bytes) -> None:
        with self.cond:
            self.inputs.setdefault(step, {})[index] = ([g.clone() for g in grads], payload)
            if len(self.inputs[step]) == NUM_TRAINERS:
                try:
                    self.results[step] = self._reduce(step, self.inputs.pop(step))
                except BaseException as exc:
                    self.error = exc
                    raise
                finally:
                    self.cond.notify_all()

    def result(self, step: int) -> RoundOutcome:
        with self.cond:
            self.cond.wait_for(lambda: step in self.results or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"the lockstep round of outer step {step} failed") from self.error
            refused = self.refused_by_step[step]
            return RoundOutcome(
                averaged=[t.clone() for t in self.results[step]],
                num_peers=NUM_TRAINERS - refused,
                refused_peers=refused,
            )

    def _reduce(self, step: int, by_index: dict[int, tuple[list[torch.Tensor], bytes]]) -> list[torch.Tensor]:
        shapes = [g.shape for g in by_index[0][0]]
        decoder = self.codecs.make(shapes, error_feedback=False)
        # what every member of the round would decode: the honest payloads, ascending index
        contributions = [decoder.decode(by_index[i][1]) for i in range(NUM_TRAINERS)]
        if self.attack is not None:
            honest = torch.stack([_flat(contributions[i]) for i in range(NUM_TRAINERS) if i not in ATTACKERS])
            own = torch.stack([_flat(by_index[i][0]) for i in ATTACKERS])
            gen = torch.Generator().manual_seed(1000 + step)
            rows = attack_inputs(self.attack, honest, own, gen)
            sender = self.codecs.make(shapes, error_feedback=False)  # any valid payload will do
            for i, row in zip(ATTACKERS, rows, strict=True):
                contributions[i] = decoder.decode(sender.encode(_shaped(row, shapes)))
        aggregate = aggregate_contributions(
            contributions,
            rule=self.rule,
            max_norm_ratio=MAX_NORM_RATIO,
            min_norm=MIN_NORM_PER_VALUE * sum(s.numel() for s in shapes) ** 0.5,
        )
        self.refused += len(aggregate.refused)
        self.refused_by_step[step] = len(aggregate.refused)
        return aggregate.tensors


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _shaped(vector: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    parts = torch.split(vector.float().contiguous(), [s.numel() for s in shapes])
    return [p.reshape(s).clone() for p, s in zip(parts, shapes, strict=True)]


class Member:
    """One trainer's `RoundAverager` in the lockstep group: encodes its contribution with its own codec."""

    def __init__(self, group: LockstepGroup, index: int, codec: PseudoGradCodec) -> None:
        self.group, self.index, self.codec = group, index, codec

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> Round:
        # an attacker's codec encodes too (it sends an attack instead): its error feedback is as if it were honest
        self.group.submit(self.index, step, pseudo_grads, self.codec.encode(pseudo_grads))
        return Round(self.group, step)

    def bytes_sent(self) -> int:
        return 0


class Round:
    def __init__(self, group: LockstepGroup, step: int) -> None:
        self.group, self.step = group, step

    def done(self) -> bool:
        with self.group.cond:
            return self.step in self.group.results or self.group.error is not None

    def result(self) -> RoundOutcome:
        return self.group.result(self.step)


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
    group = LockstepGroup(rule, attack, Codecs(args.compression, args.density, args.chunk_values))
    trainers = []
    for i in range(NUM_TRAINERS):
        torch.manual_seed(0)  # the same initial weights on every trainer
        sampler = corpus.sampler(i, NUM_TRAINERS)
        model = TinyGPT(model_config)
        trainers.append(
            DiLoCoTrainer(
                model,
                config,
                next_batch=sampler.next_batch,
                averager=group.member(i, [p.shape for p in model.parameters()]),
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
        print(
            f"    ({attack or 'clean'}, {rule}: {group.refused} contributions refused by the norm cap)",
            flush=True,
        )
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
        "--rule",
        default=DEFAULT_RULE,
        choices=AGGREGATION_RULES,
        help=f"robust rule to compare with the mean ({DEFAULT_RULE})",
    )
    parser.add_argument(
        "--compression",
        choices=("int8", "sparse"),
        default="int8",
        help="part 1: the codec every contribution goes through (default int8)",
    )
    parser.add_argument(
        "--density",
        type=float,
        default=TrainerConfig().sparse_density,
        help="sparse codec: kept fraction per chunk",
    )
    parser.add_argument(
        "--chunk-values",
        type=int,
        default=TrainerConfig().sparse_chunk_values,
        help="sparse codec: chunk size",
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
    codec = (
        "int8"
        if args.compression == "int8"
        else f"sparse (density {args.density}, chunks of {args.chunk_values})"
    )
    print(
        f"{NUM_TRAINERS} trainers, attackers {ATTACKERS}, H={args.inner_steps}, {args.outer_steps} outer steps, "
        f"codec {codec}"
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
    fields.update(run_sybil_attacks())
    fields.update(rule=args.rule, compression=args.compression, H=str(args.inner_steps),
                  outer_steps=str(args.outer_steps))  # fmt: skip
    if args.compression == "sparse":
        fields.update(density=str(args.density), chunk_values=str(args.chunk_values))
    fields["wall_s"] = f"{time.perf_counter() - start:.0f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
