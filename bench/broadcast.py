"""Benchmark of the weight broadcast: hivenet vs a naive single source vs SHARDCAST, under equal upload caps.

Delivers S bytes of random weights from one publisher to N nodes whose uploads are all capped
at the same rate B, and prints the time until the last node holds a verified copy as a
multiple of S/B (the physical lower bound: the publisher must upload S at least once).

- **hivenet**: every node is a separate process with its own hivemind DHT and p2pd, running
  `WeightBroadcast`; the upload cap is hivenet's application-level token bucket
  (`upload_bytes_per_s`) in the serving path, i.e. bytes handed to p2pd. Completion is
  `fetch()` returning: every chunk verified against the signed manifest; afterwards each
  copy's SHA-256 is compared with the publisher's.
- **naive**: the same processes and code, but every node downloads only from the publisher
  (`publisher_only=True`).
- **shardcast**: the `shardcast==0.3.2` package from the package index, installed in a scratch
  venv (never in the project's venv): an origin plus R = max(1, N // 4) relays (MiddleNode,
  polling every 1 s) and N - R clients that poll the relays every 1 s and download with wget.
  The same cap B is put on every HTTP server's upload with the same kind of token bucket
  (a patched `copyfile` of its request handler); shardcast clients never upload. Each client
  process gets its own temp-file location (shardcast writes its distribution temp file next
  to its package, which clashes when several clients share one machine).
- **fault**: hivenet at the largest N with a quarter of the fetchers SIGKILLed (whole process
  group: worker, DHT, p2pd) halfway through S/B; time until the rest hold verified copies.

Bandwidth is shaped at application level (token buckets), not with `tc`: all nodes share one
loopback interface here. The full run caps every upload at B = 1 MiB/s (8 Mbit/s, a common home
upload): at 4 MiB/s the 17 nodes' encrypted libp2p traffic (64 MiB/s in all) saturates a 2-core
machine at N=16, and the ratio measures the CPU rather than the protocol (N=16, 64 MiB: 1.92x
S/B at 4 MiB/s, 1.24x at 1 MiB/s). The naive source and SHARDCAST run only at the smaller S by
default (their times grow with N x S/B); their speed-ups in RESULT are at the largest S they ran
at, named by `naive_S_mib` and `shardcast_S_mib`. Ends with exactly one line `RESULT key=value ...`.

This file runs the sweep and reports; the hivenet node processes and one measured round are in
`bench/_broadcast_hivenet.py`, the SHARDCAST baseline in `bench/_broadcast_shardcast.py`.

    python bench/broadcast.py --quick          # S=8 MiB at 4 MiB/s, N=4,8,16 (< 3 minutes; a smoke run:
                                               # at S/B = 2 s fixed start-up costs dominate the ratios)
    python bench/broadcast.py                  # S=64,256 MiB at 1 MiB/s, N=4,8,16 (about 50 minutes)
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._broadcast_common import MIB
from bench._broadcast_hivenet import Worker, run_hivenet, run_worker, start_workers
from bench._broadcast_shardcast import ensure_shardcast_python, run_shardcast, run_shardcast_node


def _fmt(value: float) -> str:
    return "nan" if value is None or not math.isfinite(value) else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="S=8 MiB, N=4,8,16, SHARDCAST up to N=8 (under 3 minutes)"
    )
    parser.add_argument("--sizes-mib", type=int, nargs="+", help="checkpoint sizes S in MiB")
    parser.add_argument("--nodes", type=int, nargs="+", help="receiving node counts N")
    parser.add_argument("--upload-bytes-per-s", type=float, help="every node's upload cap B")
    parser.add_argument("--chunk-bytes", type=int, help="chunk size (hivenet) and shard size (shardcast)")
    parser.add_argument(
        "--upload-slots", type=int, help="hivenet: chunks each node uploads at once (default: config)"
    )
    parser.add_argument(
        "--max-inflight-per-peer",
        type=int,
        help="hivenet: chunk requests in flight per source (default: config)",
    )
    parser.add_argument("--naive-max-n", type=int, default=8, help="run the naive baseline up to this N")
    parser.add_argument(
        "--naive-max-mib", type=int, default=64, help="run the naive baseline only for S up to this many MiB"
    )
    parser.add_argument("--no-shardcast", action="store_true", help="skip the SHARDCAST comparison")
    parser.add_argument(
        "--shardcast-max-n", type=int, help="run SHARDCAST up to this N (default: every N; quick: 8)"
    )
    parser.add_argument(
        "--shardcast-max-mib", type=int, default=64, help="run SHARDCAST only for S up to this many MiB"
    )
    parser.add_argument("--shardcast-python", help="python of a venv with shardcast installed")
    # internal: worker modes
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shardcast", choices=["origin", "relay", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--identity", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--publisher", help=argparse.SUPPRESS)
    parser.add_argument(
        "--initial-peer", dest="initial_peers", action="append", default=[], help=argparse.SUPPRESS
    )
    parser.add_argument("--listen-ip", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--sc-dir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        return run_worker(args)
    if args.shardcast:
        return run_shardcast_node(args)

    sizes = [s * MIB for s in (args.sizes_mib or ([8] if args.quick else [64, 256]))]
    shardcast_max_n = args.shardcast_max_n or (8 if args.quick else 1 << 30)
    nodes = sorted(args.nodes or [4, 8, 16])
    args.upload_bytes_per_s = args.upload_bytes_per_s or (4 * MIB if args.quick else 1 * MIB)
    args.app_upload_bytes_per_s = args.upload_bytes_per_s  # shaped in the application: one loopback here
    args.chunk_bytes = args.chunk_bytes or (256 * 1024 if args.quick else 1 * MIB)
    bench_started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="hivenet-bench-"))
    print(
        f"weight broadcast benchmark: S={[s // MIB for s in sizes]} MiB, N={nodes}, "
        f"B={args.upload_bytes_per_s / MIB:.1f} MiB/s per node (application-level token bucket on every "
        f"uploader), chunk {args.chunk_bytes // 1024} KiB; {os.cpu_count()} CPU cores; times are x S/B",
        flush=True,
    )
    results: dict[str, float] = {}
    shardcast_python, shardcast_reason = (None, "skipped (--no-shardcast)")
    if not args.no_shardcast:
        shardcast_python, shardcast_reason = ensure_shardcast_python(args)
        if shardcast_python is None:
            print(f"shardcast unavailable: {shardcast_reason}", flush=True)
    workers: list[Worker] = []
    all_equal = True
    try:
        workers = start_workers(max(nodes) + 1, workdir, args)
        print(f"started {len(workers)} hivenet nodes in {time.monotonic() - bench_started:.0f} s", flush=True)
        for size in sizes:
            s_mib = size // MIB
            for n in nodes:
                hn = run_hivenet(workers, n, size, args)
                all_equal &= hn["all_equal"]
                ratio = hn["time_s"] / hn["lower_bound_s"]
                pub = hn["publisher_upload_bytes"] / hn["total_bytes"]
                line = (
                    f"S={s_mib} MiB N={n}: hivenet {ratio:.2f}x S/B ({hn['time_s']:.1f} s, publisher uploaded "
                    f"{pub:.2f}x S, {hn['from_publisher']:.0%} of fetched bytes came from it, first/median fetcher "
                    f"done at {hn['first_done_s'] / hn['lower_bound_s']:.2f}/{hn['median_done_s'] / hn['lower_bound_s']:.2f}x, "
                    f"copies equal: {hn['all_equal']})"
                )
                results[f"hivenet_over_lower_bound_n{n}_s{s_mib}"] = ratio
                results[f"publisher_upload_over_S_n{n}_s{s_mib}"] = pub
                if n <= args.naive_max_n and s_mib <= args.naive_max_mib:
                    naive = run_hivenet(workers, n, size, args, publisher_only=True)
                    all_equal &= naive["all_equal"]
                    results[f"naive_over_lower_bound_n{n}_s{s_mib}"] = (
                        naive["time_s"] / naive["lower_bound_s"]
                    )
                    results[f"speedup_vs_naive_n{n}_s{s_mib}"] = naive["time_s"] / hn["time_s"]
                    line += f"; naive {naive['time_s'] / naive['lower_bound_s']:.2f}x (equal: {naive['all_equal']})"
                if shardcast_python is not None and n <= shardcast_max_n and s_mib <= args.shardcast_max_mib:
                    try:
                        sc = run_shardcast(shardcast_python, n, size, args, workdir)
                        all_equal &= sc["all_equal"]
                        results[f"shardcast_over_lower_bound_n{n}_s{s_mib}"] = (
                            sc["time_s"] / sc["lower_bound_s"]
                        )
                        results[f"speedup_vs_shardcast_n{n}_s{s_mib}"] = sc["time_s"] / hn["time_s"]
                        line += (
                            f"; shardcast ({sc['relays']} relays) {sc['time_s'] / sc['lower_bound_s']:.2f}x "
                            f"(equal: {sc['all_equal']})"
                        )
                    except Exception as exc:
                        print(f"shardcast failed at N={n}: {exc!r}", flush=True)
                print(line, flush=True)
        # fault run: a quarter of the fetchers killed halfway through S/B, at the largest N and smallest S
        n, size = nodes[-1], sizes[0]
        fault = run_hivenet(workers, n, size, args, kill_fraction=0.25)
        all_equal &= fault["all_equal"]
        results["fault_over_lower_bound"] = fault["time_s"] / fault["lower_bound_s"]
        results["fault_n"], results["fault_S_mib"] = float(n), float(size // MIB)
        print(
            f"fault run S={size // MIB} MiB N={n}: {n // 4} nodes killed at 0.5 S/B; the other "
            f"{fault['nodes_done']} completed in {fault['time_s'] / fault['lower_bound_s']:.2f}x S/B "
            f"(copies equal: {fault['all_equal']})",
            flush=True,
        )
    finally:
        for worker in workers:
            worker.close()
        shutil.rmtree(workdir, ignore_errors=True)

    # Headline numbers for each N at the largest S; the naive source and SHARDCAST only run up to
    # --naive-max-mib / --shardcast-max-mib (their times grow with N x S/B), so their speed-ups are
    # the ones at the largest S each ran at.
    s_head = sizes[-1] // MIB
    naive_sizes = [s // MIB for s in sizes if s // MIB <= args.naive_max_mib]
    s_naive = naive_sizes[-1] if naive_sizes else 0
    shardcast_sizes = [s // MIB for s in sizes if s // MIB <= args.shardcast_max_mib]
    s_shardcast = shardcast_sizes[-1] if shardcast_sizes else 0
    headline: dict[str, float] = {}
    for n in nodes:
        for key, s_mib in (
            ("hivenet_over_lower_bound", s_head),
            ("speedup_vs_naive", s_naive),
            ("speedup_vs_shardcast", s_shardcast),
            ("publisher_upload_over_S", s_head),
        ):
            headline[f"{key}_n{n}"] = results.get(f"{key}_n{n}_s{s_mib}", float("nan"))
    headline["naive_S_mib"] = float(s_naive)
    headline["shardcast_S_mib"] = float(s_shardcast)
    headline.update({k: v for k, v in results.items() if k.startswith("fault_")})
    fields = " ".join(f"{key}={_fmt(value)}" for key, value in headline.items())
    shaping = "app_token_bucket"
    print(
        f"RESULT S_mib={s_head} B_mib_per_s={args.upload_bytes_per_s / MIB:.1f} shaping={shaping} {fields} "
        f"all_copies_equal={int(all_equal)} shardcast={'ran' if shardcast_python else 'unavailable'} "
        f"bench_s={time.monotonic() - bench_started:.0f}"
    )


if __name__ == "__main__":
    main()
