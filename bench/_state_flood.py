"""Part 5 of `bench/robustness.py`: a flood of outer-state downloads against a training trainer (#30 item 4).

Two trainers of the averaging service (int8, the tiny model of
`tests.helpers.trainers.tiny_config`, one torch thread each, naming each other as the run's
publishers, as a run of two must) train on 127.0.0.1 in this process with the production
state-service budgets. A second process (so that the attackers' own Python does not hold this
process's GIL) keeps 4 fresh identities with 4 download streams each (`tests.helpers.state_flood`)
pointed at trainer 0's state service, idle or flooding by phase.

Phases alternate clean, flood, clean, flood, ... (`reps` of each), each `steps` outer steps of the
victim, after warm-up steps. With overlapped communication a trainer emits one `OuterStepReport`
per round, at its end, so the delta of `inner_time_s` between two consecutive reports is the time
of exactly H inner steps; the first report of each phase is dropped (its round straddles the
switch). Reported, pooled over the phases of each kind:

* `flood_step_slowdown`: the victim's median inner-step time under the flood over without it,
  minus 1 (target <= 0.05); the same for the other trainer (`flood_peer_step_slowdown`: it shares
  the process, hence the GIL, and the machine, not the flood) and for the victim's whole outer
  steps, rounds included (`flood_outer_step_slowdown`);
* `flood_upload_mb_per_s`: the victim's state-service bytes sent per second of flood (headers
  and payloads; the refusals' error frames are not counted by the service);
* `flood_refusals`: the requests the victim refused during the flood (by reason in the table);
  `flood_requests_per_s`, the requests the attackers made per second; `flood_rounds_alone`, the
  victim's flooded rounds averaged without the other trainer or followed by a resync;
* `flood_victim_loop_cpu_frac` and `flood_victim_p2pd_cpu_frac`: the CPU time of the victim's
  event-loop thread and of its p2pd per second of flood (against `clean_...`), what serving the
  flood cost the victim itself.

The attackers are other machines in a real swarm; here they share this one. So that their own CPU
(their process and four p2pd daemons) is not counted as the victim's slowdown, they run on cores
of their own: on a machine of N >= 2 cores the attackers get the last N // 2 (at least one), and
this process (both trainers, their event loops, p2pd and DHT daemons) the others, for the clean
and the flooded phases alike (`flood_cpus`: this process's cores / the attackers'). What remains
of the slowdown is what serving the flood costs the victim: its event loop, its p2pd, the
network stack. On one core no split is possible and the figure includes the attackers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psutil
from hivemind.p2p import PeerID

from node.collective.averager import GatherAverager
from node.swarm import wait_until
from tests.helpers.state_flood import FloodStats, state_flood
from tests.helpers.trainers import harness, tiny_config
from training.diloco import OuterStepReport
from training.trainer_thread import TrainerThread

IDENTITIES, STREAMS = 4, 4
MB = 1e6


def _flood_worker(
    conn: Connection,
    victim: str,
    proto: str,
    shapes: list[tuple[int, ...]],
    peers: list[str],
    identities: int,
    streams: int,
    attacker_cpus: set[int],
) -> None:
    """The attackers' process: obeys "start", "pause" (answers the counters) and "stop" on `conn`."""
    logging.basicConfig(level=logging.WARNING)
    _pin_process(attacker_cpus)  # before its daemons start: they inherit the cores
    with state_flood(
        PeerID.from_base58(victim), proto, shapes, peers, identities=identities, streams=streams, start=False
    ) as flood:
        conn.send("ready")
        while True:
            try:
                command = conn.recv()
            except EOFError:  # the benchmark is gone
                return
            if command == "start":
                flood.start()
                conn.send("started")
            elif command == "pause":
                conn.send(flood.pause())
            else:
                return


def _split_cpus() -> tuple[set[int], set[int]]:
    """(this process's cores, the attackers' cores): disjoint where there are two or more."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    split = len(cpus) - max(1, len(cpus) // 2)
    return set(cpus[:split]), set(cpus[split:])


def _pin_process(cpus: set[int]) -> set[int]:
    """Pin every thread of this process to `cpus` (threads and processes started later inherit
    it from their creator); returns the cores it had."""
    before = os.sched_getaffinity(0)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    return before


class _Attackers:
    """The attackers' process, driven over a pipe."""

    def __init__(self, victim: GatherAverager, peers: list[str], cpus: set[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        shapes = [tuple(s) for s in victim.shapes]
        args = (
            child,
            victim.p2p.peer_id.to_base58(),
            victim.states.proto,
            shapes,
            peers,
            IDENTITIES,
            STREAMS,
            cpus,
        )
        self.process = ctx.Process(target=_flood_worker, args=args, name="state-flood")
        self.process.start()
        child.close()

    def _ask(self, command: str | None, timeout_s: float = 120.0) -> Any:
        if command is not None:
            self.conn.send(command)
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"the flood process did not answer {command or 'ready'!r} in {timeout_s:g} s")
        return self.conn.recv()

    def ready(self) -> None:
        self._ask(None)

    def start(self) -> None:
        self._ask("start")

    def pause(self) -> FloodStats:
        stats = self._ask("pause")
        assert isinstance(stats, FloodStats)
        return stats

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send("stop")
        self.process.join(30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        self.conn.close()


@dataclass
class _Phase:
    kind: str
    victim_ms: list[float] = field(default_factory=list)
    """The victim's inner-step time in each whole round of the phase, in milliseconds."""
    peer_ms: list[float] = field(default_factory=list)
    victim_round_s: list[float] = field(default_factory=list)
    """The victim's wall time of each whole round (an outer step, waits included)."""
    alone: int = 0
    """The victim's rounds of the phase averaged without the other trainer, or that left it to resync."""
    seconds: float = 0.0
    bytes_sent: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    loop_cpu_s: float = 0.0
    p2pd_cpu_s: float = 0.0
    requests: int = 0


def _window(trainer: TrainerThread, first: int, last: int) -> list[OuterStepReport]:
    """Reports `first - 1` .. `last`: the rounds `first` .. `last` with the one before the first."""
    return trainer.reports[max(first - 1, 0) : last + 1]


def _per_step_ms(reports: list[OuterStepReport], inner_steps: int) -> list[float]:
    """The inner-step time of each report's round (against the report before it), in milliseconds."""
    return [1000 * (b.inner_time_s - a.inner_time_s) / inner_steps for a, b in itertools.pairwise(reports)]


def _thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's thread called `name` so far (0 if there is none)."""
    ids = {t.native_id for t in threading.enumerate() if t.name == name}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def _children_cpu_s(pid: int | None) -> float:
    """CPU seconds of the children of process `pid` (a DHT's: its p2pd) so far."""
    total = 0.0
    with contextlib.suppress(psutil.Error, TypeError):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                total += times.user + times.system
    return total


def _service_counters(averager: GatherAverager) -> tuple[int, Counter[str]]:
    async def read() -> tuple[int, Counter[str]]:  # on the loop that updates them: a consistent copy
        return averager.states.bytes_sent, Counter(averager.states.refusals)

    return averager.runtime.call(read(), timeout_s=30)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_state_flood(quick: bool) -> dict[str, str]:
    """Part 5's figures (see the module docstring)."""
    inner_steps, steps, reps, warmup = (20, 8, 3, 3) if quick else (20, 20, 5, 3)
    started = time.perf_counter()
    # a short gather (`min_gather_s` follows `matchmaking_time_s`): more rounds, hence samples, per second
    config = tiny_config(
        10_000,
        inner_steps=inner_steps,
        compression="int8",
        matchmaking_time_s=0.3,
    )
    phases: list[_Phase] = []
    own_cpus, attacker_cpus = _split_cpus()
    all_cpus = _pin_process(own_cpus)
    try:
        _flood_phases(
            config, phases, attacker_cpus, inner_steps=inner_steps, steps=steps, reps=reps, warmup=warmup
        )
    finally:
        _pin_process(all_cpus)
    fields = _report(phases, time.perf_counter() - started)
    fields["flood_cpus"] = f"{len(own_cpus)}/{len(attacker_cpus)}" + (
        "" if own_cpus != attacker_cpus else "(shared)"
    )
    return fields


def _flood_phases(
    config: Any,
    phases: list[_Phase],
    attacker_cpus: set[int],
    *,
    inner_steps: int,
    steps: int,
    reps: int,
    warmup: int,
) -> None:
    """Train the two trainers through `reps` clean and flooded phases of `steps` rounds each, appending to `phases`."""
    with harness() as h:
        # two trainers name each other (a run of two needs it to recover from a diverged round)
        victim_thread, peer_thread = h.prepare_publishers(config, ["flood-victim", "flood-peer"])
        victim: GatherAverager = victim_thread.runtime.averager
        peers = [str(a) for a in victim_thread.runtime.dht.get_visible_maddrs()]
        attackers = _Attackers(victim, peers, attacker_cpus)
        try:
            attackers.ready()
            victim_thread.start()
            peer_thread.start()

            def reached(count: int) -> bool:
                if not (victim_thread.alive and peer_thread.alive):
                    raise RuntimeError(f"a trainer stopped: {victim_thread.error or peer_thread.error!r}")
                return len(victim_thread.reports) >= count and len(peer_thread.reports) >= 1

            if not wait_until(lambda: reached(warmup), timeout_s=120, interval_s=0.02):
                raise RuntimeError("the trainers made no progress")
            loop_thread, dht_pid = f"{victim_thread.name}-averaging-loop", victim_thread.runtime.dht.pid
            for kind in ("clean", "flood") * reps:
                phase = _Phase(kind)
                if kind == "flood":
                    attackers.start()
                first, peer_first = len(victim_thread.reports), len(peer_thread.reports)
                sent, refused = _service_counters(victim)
                cpu, p2pd, t0 = _thread_cpu_s(loop_thread), _children_cpu_s(dht_pid), time.perf_counter()
                # the round in flight at the switch straddles it: the phase is the `steps` rounds after it
                target = first + steps + 1
                if not wait_until(lambda: reached(target), timeout_s=300, interval_s=0.02):  # noqa: B023
                    raise RuntimeError("the victim stopped making outer steps")
                last, peer_last = len(victim_thread.reports) - 1, len(peer_thread.reports) - 1
                phase.seconds = time.perf_counter() - t0
                phase.loop_cpu_s = _thread_cpu_s(loop_thread) - cpu
                phase.p2pd_cpu_s = _children_cpu_s(dht_pid) - p2pd
                sent_after, refused_after = _service_counters(victim)
                if kind == "flood":
                    phase.requests = attackers.pause().total_requests - sum(p.requests for p in phases)
                phase.bytes_sent = sent_after - sent
                phase.refusals = refused_after - refused
                rounds = _window(victim_thread, first + 1, last)
                phase.victim_ms = _per_step_ms(rounds, inner_steps)
                phase.victim_round_s = [b.wall_time_s - a.wall_time_s for a, b in itertools.pairwise(rounds)]
                phase.alone = sum(r.num_peers < 2 or r.resynced for r in rounds[1:])
                phase.peer_ms = _per_step_ms(_window(peer_thread, peer_first + 1, peer_last), inner_steps)
                phases.append(phase)
        finally:
            attackers.close()


def _report(phases: list[_Phase], wall_s: float) -> dict[str, str]:
    print(
        f"\nstate-download flood ({IDENTITIES} identities x {STREAMS} streams) on one of two gather trainers"
    )
    print(f"{'phase':<7}{'rounds':>7}{'alone':>6}{'victim ms/step':>15}{'peer ms/step':>13}{'s/round':>8}"
          f"{'upload MB/s':>12}{'req/s':>7}{'loop cpu':>9}{'p2pd cpu':>9}  refusals")  # fmt: skip
    for p in phases:
        reasons = " ".join(f"{k}={v}" for k, v in sorted(p.refusals.items()) if v)
        print(f"{p.kind:<7}{len(p.victim_ms):>7}{p.alone:>6}{_median(p.victim_ms):>15.2f}{_median(p.peer_ms):>13.2f}"
              f"{_median(p.victim_round_s):>8.2f}{p.bytes_sent / MB / p.seconds:>12.3f}{p.requests / p.seconds:>7.0f}"
              f"{p.loop_cpu_s / p.seconds:>9.2f}{p.p2pd_cpu_s / p.seconds:>9.2f}  {reasons or '-'}")  # fmt: skip
    by_kind = {kind: [p for p in phases if p.kind == kind] for kind in ("clean", "flood")}

    def pooled(kind: str, attr: str) -> float:
        return _median([x for p in by_kind[kind] for x in getattr(p, attr)])

    def per_s(kind: str, attr: str) -> float:
        return sum(getattr(p, attr) for p in by_kind[kind]) / sum(p.seconds for p in by_kind[kind])

    def slowdown(attr: str) -> float:
        return pooled("flood", attr) / pooled("clean", attr) - 1

    refusals: Counter[str] = sum((p.refusals for p in by_kind["flood"]), Counter())
    fields = {
        "flood_step_slowdown": f"{slowdown('victim_ms'):.3f}",
        "flood_peer_step_slowdown": f"{slowdown('peer_ms'):.3f}",
        "flood_outer_step_slowdown": f"{slowdown('victim_round_s'):.3f}",
        "flood_upload_mb_per_s": f"{per_s('flood', 'bytes_sent') / MB:.3f}",
        "flood_refusals": str(sum(refusals.values())),
        "flood_requests_per_s": f"{per_s('flood', 'requests'):.0f}",
        "flood_rounds_alone": f"{sum(p.alone for p in by_kind['flood'])}/{sum(len(p.victim_ms) for p in by_kind['flood'])}",
        "flood_victim_loop_cpu_frac": f"{per_s('flood', 'loop_cpu_s'):.2f}",
        "clean_victim_loop_cpu_frac": f"{per_s('clean', 'loop_cpu_s'):.2f}",
        "flood_victim_p2pd_cpu_frac": f"{per_s('flood', 'p2pd_cpu_s'):.2f}",
        "clean_victim_p2pd_cpu_frac": f"{per_s('clean', 'p2pd_cpu_s'):.2f}",
    }
    print(
        f"victim inner step {pooled('clean', 'victim_ms'):.2f} ms clean, {pooled('flood', 'victim_ms'):.2f} ms "
        f"flooded (medians): {slowdown('victim_ms'):+.1%} (target <= +5%); the other trainer's "
        f"{slowdown('peer_ms'):+.1%}; the victim's outer steps {slowdown('victim_round_s'):+.1%}; it uploaded "
        f"{fields['flood_upload_mb_per_s']} MB/s of state under the flood and refused "
        f"{fields['flood_refusals']} requests ({wall_s:.0f} s)"
    )
    return fields


if __name__ == "__main__":  # part 5 alone: python -m bench._state_flood [--full]
    import sys

    logging.basicConfig(level=logging.WARNING)
    fields = run_state_flood(quick="--full" not in sys.argv)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
