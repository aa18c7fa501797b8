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

It then runs an RL swarm on the same kind of links (trainer, validator and one inference worker on
public hosts, one inference worker behind a NAT that lets nothing in) and counts the rollouts each
worker has accepted over the same window once both have had one accepted: `natted_over_public` is
the NATed worker's rate over the public one's (target >= 0.9).

Links add no delay beyond queueing: `netem` is missing from this kernel. Ends with one line
`RESULT key=value ...`.

    python bench/netns.py --quick     # S=16 MiB, N=8; a 60 s RL window; 20 Mbit/s (under 3 minutes)
    python bench/netns.py             # S=64 MiB, N=8 and 16; a 180 s RL window
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._broadcast_common import MIB
from bench._broadcast_hivenet import run_hivenet, start_workers
from node.swarm import LocalSwarm, wait_until
from tests.helpers.netns import INTERNET, Lab, skip_reason

ACCEPTED = re.compile(r"group +\d+ \| v\d+ \| accepted (\d+) \|")


def _accepted(log: Path) -> int:
    return sum(int(n) for n in ACCEPTED.findall(log.read_text(errors="replace")))


def _rollouts(window_s: float, rate_mbit: float) -> dict[str, float]:
    """Accepted rollouts per minute of a NATed and a public inference worker of one RL run."""
    from node.identity import create_identity

    workdir = Path(tempfile.mkdtemp(prefix="hivenet-netns-rl-"))
    lab_network = ["--dialable-network", str(INTERNET)]
    try:
        with Lab() as lab, LocalSwarm(run_id="bench-rl", workdir=workdir) as swarm:
            seed = lab.public_host("seed", rate_mbit=rate_mbit)
            hosts = {
                name: lab.public_host(name, rate_mbit=rate_mbit)
                for name in ("trainer", "validator", "public")
            }
            hosts["natted"] = lab.host_behind(lab.router("home"), "natted", rate_mbit=rate_mbit)
            trainer = create_identity(workdir / "trainer.key").peer_id.to_base58()
            validator = create_identity(workdir / "validator.key").peer_id.to_base58()
            common = ["--rl", "--trusted-validator", validator, *lab_network]
            swarm.start_seed(placement=seed.placement, extra_args=lab_network)
            for name, role in (("trainer", "trainer"), ("validator", "validator"), ("public", "inference"),
                               ("natted", "inference")):  # fmt: skip
                key = workdir / f"{name}.key"
                extra = common if name == "trainer" else [*common, "--publisher", trainer]
                swarm.add_node(
                    name=name, roles=[role], wait=False, identity_path=key, placement=hosts[name].placement,
                    extra_args=extra,
                )  # fmt: skip
            logs = {name: swarm.nodes[name].log_file for name in ("public", "natted")}
            if not wait_until(lambda: all(_accepted(log) > 0 for log in logs.values()), timeout_s=600):
                tails = "\n".join(f"--- {n}\n{swarm.nodes[n].log_tail(15)}" for n in swarm.nodes)
                raise RuntimeError(f"the workers had no rollout accepted within 600 s:\n{tails}")
            before = {name: _accepted(log) for name, log in logs.items()}
            started = time.monotonic()
            time.sleep(window_s)  # a rate over a fixed window of wall time
            elapsed = time.monotonic() - started
            return {name: (_accepted(log) - before[name]) * 60 / elapsed for name, log in logs.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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

    rates = _rollouts(60.0 if args.quick else 180.0, args.rate_mbit)
    print(f"rollouts accepted per minute: public {rates['public']:.1f}, behind NAT {rates['natted']:.1f}")
    result["natted_over_public"] = f"{rates['natted'] / max(rates['public'], 1e-9):.3f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
