"""Benchmark: swarm formation time and memory per node, hivenet vs bare hivemind DHT nodes.

For each N, starts a seed and N nodes on 127.0.0.1 as separate processes, twice: hivenet
nodes (`hivenet join`, signed records, validation) and bare hivemind DHT nodes doing the
same store/refresh/read loop without signatures (bench/_bare_dht_node.py). Both refresh
and poll every 2 s. Reports the time from launch until every node discovers every other,
and the proportional memory (PSS) per node of each node's process tree, and the ratios
hivenet / bare (our overhead).

    python bench/membership.py            # N = 4, 8, 16
    python bench/membership.py --quick    # N = 4, 8, 16 with one repetition, < 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from node.swarm import LocalSwarm, wait_until  # noqa: E402

REFRESH_S = 2.0
TTL_S = 8.0


def tree_pss_bytes(pid: int) -> int:
    """Proportional set size of a process and all its descendants (shared pages split fairly)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def run_hivenet(num_nodes: int) -> tuple[float, float]:
    started = time.monotonic()
    with LocalSwarm(
        run_id="bench", record_ttl_s=TTL_S, refresh_interval_s=REFRESH_S, start_timeout_s=300
    ) as swarm:
        swarm.start(num_nodes)
        elapsed = time.monotonic() - started
        memory = statistics.mean(tree_pss_bytes(node.process.pid) for node in swarm.nodes.values())
    return elapsed, memory


def _status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def run_bare(num_nodes: int) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-bare-"))
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, initial_peer: str | None) -> Path:
        status = workdir / f"{name}.json"
        command = [
            sys.executable,
            str(REPO / "bench" / "_bare_dht_node.py"),
            "--status-file",
            str(status),
            "--refresh-interval",
            str(REFRESH_S),
            "--record-ttl",
            str(TTL_S),
        ]
        if initial_peer:
            command += ["--initial-peer", initial_peer]
        processes.append(
            subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        )
        return status

    started = time.monotonic()
    try:
        seed_status = spawn("seed", None)
        if not wait_until(lambda: _status(seed_status) is not None, 300):
            raise RuntimeError("bare seed did not start")
        seed_addr = _status(seed_status)["multiaddrs"][0]  # type: ignore[index]
        statuses = [spawn(f"node{i}", seed_addr) for i in range(num_nodes)]

        def converged() -> bool:
            views = [_status(path) for path in [seed_status, *statuses]]
            if any(view is None for view in views):
                return False
            everyone = {view["peer_id"] for view in views}  # type: ignore[index]
            return all(set(view["live_nodes"]) == everyone for view in views[1:])  # type: ignore[index]

        if not wait_until(converged, 600):
            raise RuntimeError("bare swarm did not converge")
        elapsed = time.monotonic() - started
        memory = statistics.mean(tree_pss_bytes(p.pid) for p in processes[1:])
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    return elapsed, memory


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repetition per N (under 3 minutes)")
    parser.add_argument("--sizes", default="4,8,16", help="comma-separated node counts")
    args = parser.parse_args()
    repeats = 1 if args.quick else 2
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = []
    result: dict[str, str] = {}
    for n in sizes:
        bare_t, bare_m, ours_t, ours_m = [], [], [], []
        for _ in range(repeats):  # interleaved, so machine noise hits both alike
            t, m = run_bare(n)
            bare_t.append(t)
            bare_m.append(m)
            t, m = run_hivenet(n)
            ours_t.append(t)
            ours_m.append(m)
        row = (
            n,
            statistics.median(ours_t),
            statistics.median(bare_t),
            statistics.median(ours_m) / 2**20,
            statistics.median(bare_m) / 2**20,
        )
        rows.append(row)
        result[f"discovery_time_ratio_n{n}"] = f"{row[1] / row[2]:.2f}"
        result[f"memory_ratio_n{n}"] = f"{row[3] / row[4]:.2f}"
        print(
            f"N={n}: hivenet {row[1]:.1f} s / {row[3]:.0f} MiB per node, bare {row[2]:.1f} s / {row[4]:.0f} MiB",
            flush=True,
        )
    print()
    print(
        f"{'N':>3} | {'hivenet s':>9} | {'bare s':>7} | {'ratio':>5} | {'hivenet MiB/node':>16} | "
        f"{'bare MiB/node':>13} | {'ratio':>5}"
    )
    for n, ours_s, bare_s, ours_mib, bare_mib in rows:
        print(
            f"{n:>3} | {ours_s:>9.1f} | {bare_s:>7.1f} | {ours_s / bare_s:>5.2f} | {ours_mib:>16.0f} | "
            f"{bare_mib:>13.0f} | {ours_mib / bare_mib:>5.2f}"
        )
    print("RESULT " + " ".join(f"{key}={value}" for key, value in result.items()))


if __name__ == "__main__":
    main()
