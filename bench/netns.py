"""Benchmark on separate hosts: the weight broadcast between network namespaces joined by links that
`tc` shapes to a home connection's rate (`tests.helpers.netns`; needs root, `ip`, `tc` and `nft`).

Every node is a process on a host of its own (the same worker as `bench/broadcast.py`: its own
hivemind DHT and p2pd), every host's link carries R Mbit/s in each direction, and nothing in the
application caps anything: the kernel's token-bucket queues do, as a modem would. One publisher
sends S bytes to N fetchers; the figure is the time until the last fetcher holds a verified copy,
against two baselines of the same run:

- `S/B`: the size over the link rate, the physical lower bound (the publisher must send S once);
- `single`: the measured time of one fetcher alone fetching the same S from the publisher over the
  same links (what protocol and start-up overheads cost a single copy).

Links add no delay beyond queueing: `netem` is missing from this kernel. Ends with one line
`RESULT key=value ...`.

    python bench/netns.py --quick     # S=16 MiB, N=8, 20 Mbit/s (under 3 minutes)
    python bench/netns.py             # S=64 MiB, N=8 and 16, 20 Mbit/s
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._broadcast_common import MIB
from bench._broadcast_hivenet import run_hivenet, start_workers
from tests.helpers.netns import Lab, skip_reason


def _broadcast(n: int, size: int, args: Any) -> dict[str, Any]:
    """Publish S on one host and fetch it on N others (all on shaped links); then one fetcher alone."""
    workdir = Path(tempfile.mkdtemp(prefix="hivenet-netns-bench-"))
    try:
        with Lab() as lab:
            hosts = [lab.public_host(f"h{i}", rate_mbit=args.rate_mbit) for i in range(n + 1)]
            workers = start_workers(n + 1, workdir, args, [host.placement for host in hosts])
            try:
                swarm = run_hivenet(workers, n, size, args)
                single = run_hivenet(workers, 1, size, args)
            finally:
                for worker in workers:
                    worker.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    link_s = swarm["total_bytes"] * 8 / (args.rate_mbit * 1e6)
    return {
        "n": n,
        "size_mib": size // MIB,
        "time_s": swarm["time_s"],
        "single_s": single["time_s"],
        "over_sb": swarm["time_s"] / link_s,
        "over_single": swarm["time_s"] / single["time_s"],
        "from_publisher": swarm["from_publisher"],
        "all_equal": swarm["all_equal"] and single["all_equal"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="S=16 MiB, N=8 (under 3 minutes)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", help="checkpoint sizes S in MiB")
    parser.add_argument("--nodes", type=int, nargs="+", help="fetcher counts N")
    parser.add_argument("--rate-mbit", type=float, default=20.0, help="every host's link rate, each way")
    parser.add_argument("--chunk-bytes", type=int, default=1 * MIB, help="chunk size")
    args = parser.parse_args()
    reason = skip_reason()
    if reason is not None:
        print(f"cannot build hosts here: {reason}", file=sys.stderr)
        return 2
    sizes = [s * MIB for s in (args.sizes_mib or ([16] if args.quick else [64]))]
    nodes = args.nodes or ([8] if args.quick else [8, 16])
    # the links shape the traffic; the workers cap nothing themselves
    args.upload_bytes_per_s = args.rate_mbit * 1e6 / 8  # run_hivenet's lower bound, for its timeouts
    args.app_upload_bytes_per_s = None
    args.upload_slots = args.max_inflight_per_peer = None

    rows = []
    print(
        f"{'N':>3} {'S MiB':>6} {'last s':>7} {'single s':>8} {'/ S/B':>6} {'/ single':>8} {'publisher':>9} ok"
    )
    for size in sizes:
        for n in nodes:
            started = time.monotonic()
            row = _broadcast(n, size, args)
            rows.append(row)
            print(
                f"{n:>3} {row['size_mib']:>6} {row['time_s']:>7.1f} {row['single_s']:>8.1f} {row['over_sb']:>6.2f} "
                f"{row['over_single']:>8.2f} {row['from_publisher']:>9.2f} {row['all_equal']} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    largest = max(r["size_mib"] for r in rows)
    result = {"rate_mbit": f"{args.rate_mbit:g}", "S_mib": largest}
    for row in rows:
        if row["size_mib"] == largest:
            result[f"broadcast{row['n']}_over_sb"] = f"{row['over_sb']:.3f}"
            result[f"broadcast{row['n']}_over_single"] = f"{row['over_single']:.3f}"
    result["all_copies_verified"] = int(all(r["all_equal"] for r in rows))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
