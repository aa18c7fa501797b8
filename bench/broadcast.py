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

    python bench/broadcast.py --quick          # S=8 MiB at 4 MiB/s, N=4,8,16 (< 3 minutes; a smoke run:
                                               # at S/B = 2 s fixed start-up costs dominate the ratios)
    python bench/broadcast.py                  # S=64,256 MiB at 1 MiB/s, N=4,8,16 (about 50 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
SHARDCAST_VERSION = "0.3.2"


# ---------------------------------------------------------------------------------------------
# hivenet worker (one per node, in its own process group)
# ---------------------------------------------------------------------------------------------


def _reply(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def run_worker(args: argparse.Namespace) -> None:
    """A hivenet node driven by JSON commands on stdin (one per line), replying on stdout."""
    import asyncio
    import logging

    from node.broadcast.broadcaster import WeightBroadcast
    from node.broadcast.config import BroadcastConfig
    from node.dht_node import start_loopback_dht
    from node.identity import load_or_create_identity

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    identity = load_or_create_identity(Path(args.identity))
    dht = start_loopback_dht(args.initial_peers, identity=identity)

    tuning = {"upload_slots": args.upload_slots, "max_inflight_per_peer": args.max_inflight_per_peer}

    async def main() -> None:
        config = BroadcastConfig(
            store_dir=Path(args.store),
            authorized_publishers=[args.publisher],
            chunk_bytes=args.chunk_bytes,
            upload_bytes_per_s=args.upload_bytes_per_s,
            keep_versions=1,
            holder_refresh_s=0.5,
            holder_ttl_s=30.0,
            retry_after_failure_s=2.0,
            request_timeout_s=30.0,
            **{k: v for k, v in tuning.items() if v is not None},
        )
        broadcast = WeightBroadcast(dht=dht, identity=identity, config=config)
        await broadcast.start()
        _reply(
            event="ready",
            peer_id=identity.peer_id.to_base58(),
            maddrs=[str(m) for m in dht.get_visible_maddrs()],
        )
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            kind = command["cmd"]
            if kind == "publish":
                import torch

                generator = torch.Generator().manual_seed(command["seed"])
                floats = command["size_bytes"] // 4
                names = 8
                state = {
                    f"layer.{i}.weight": torch.randn(floats // names, generator=generator)
                    for i in range(names)
                }
                manifest = await broadcast.publish(command["run"], 1, state)
                _reply(
                    event="published",
                    sha256=_file_sha256(broadcast, command["run"]),
                    total_bytes=manifest.total_bytes,
                )
            elif kind == "fetch":
                broadcast.config.publisher_only = bool(command["publisher_only"])
                entry = await broadcast.fetch(command["run"], 1)
                done = time.time()
                fetcher = broadcast.last_fetch
                _reply(
                    event="fetched",
                    at=done,
                    downloaded=fetcher.bytes_downloaded if fetcher else 0,
                    from_publisher=fetcher.bytes_by_source[fetcher.publisher.to_bytes()] if fetcher else 0,
                    bad_chunks=fetcher.bad_chunks if fetcher else 0,
                    sha256=_file_sha256(broadcast, command["run"]),
                    complete=entry.complete,
                )
            elif kind == "stats":
                _reply(event="stats", uploaded=broadcast.service.uploaded_bytes)
            elif kind == "drop":
                for version in broadcast.store.versions(command["run"]):
                    broadcast.service.withdraw(command["run"], version)
                    broadcast.store.remove(command["run"], version)
                _reply(event="dropped")
            elif kind == "quit":
                break
        await broadcast.stop()

    try:
        asyncio.run(main())
    finally:
        dht.shutdown()


def _file_sha256(broadcast: Any, run: str) -> str:
    entry = broadcast.store.get(run, 1)
    digest = hashlib.sha256()
    with open(entry.data_path, "rb") as handle:
        while piece := handle.read(8 * MIB):
            digest.update(piece)
    return digest.hexdigest()


class Worker:
    """The coordinator's handle on one worker process."""

    def __init__(
        self, index: int, workdir: Path, publisher_id: str, initial_peers: list[str], args: Any
    ) -> None:
        self.index = index
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--identity",
            str(workdir / f"id{index}.key"),
            "--store",
            str(workdir / f"store{index}"),
            "--publisher",
            publisher_id,
            "--chunk-bytes",
            str(args.chunk_bytes),
            "--upload-bytes-per-s",
            str(args.upload_bytes_per_s),
        ]
        for peer in initial_peers:
            command += ["--initial-peer", peer]
        for flag, value in (
            ("--upload-slots", args.upload_slots),
            ("--max-inflight-per-peer", args.max_inflight_per_peer),
        ):
            if value is not None:
                command += [flag, str(value)]
        self.log = open(workdir / f"worker{index}.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,  # its own process group: kill() takes the DHT and p2pd with it
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.alive = True

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def recv(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise TimeoutError(f"worker {self.index} did not answer within {timeout_s} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.index} exited; see its log")
        return json.loads(line)

    def kill(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.alive = False

    def close(self) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                self.send(cmd="quit")
                self.process.wait(timeout=5)
            self.kill()
        self.log.close()


def _start_workers(count: int, workdir: Path, args: Any) -> list[Worker]:
    from node.identity import create_identity

    publisher_id = create_identity(workdir / "id0.key").peer_id.to_base58()
    workers = [Worker(0, workdir, publisher_id, [], args)]
    ready = workers[0].recv(timeout_s=180)
    seeds = [m if "/p2p/" in m else f"{m}/p2p/{ready['peer_id']}" for m in ready["maddrs"]]
    workers += [Worker(i, workdir, publisher_id, seeds, args) for i in range(1, count)]
    for worker in workers[1:]:
        worker.recv(timeout_s=300)
    return workers


def _collect(workers: list[Worker], timeout_s: float, on_progress: Any = None) -> list[dict[str, Any]]:
    """Wait for one reply from each worker, calling `on_progress(elapsed)` while waiting."""
    replies: list[dict[str, Any]] = []
    selector = selectors.DefaultSelector()
    for worker in workers:
        assert worker.process.stdout is not None
        selector.register(worker.process.stdout, selectors.EVENT_READ, worker)
    started = time.monotonic()
    pending = set(workers)
    while pending:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{len(pending)} workers did not finish within {timeout_s} s")
        for key, _ in selector.select(timeout=0.2):
            worker = key.data
            replies.append(json.loads(worker.process.stdout.readline()))
            selector.unregister(worker.process.stdout)
            pending.discard(worker)
        if on_progress is not None:
            on_progress(time.monotonic() - started)
    return replies


def run_hivenet(
    workers: list[Worker],
    n: int,
    size: int,
    args: Any,
    *,
    publisher_only: bool = False,
    kill_fraction: float = 0.0,
) -> dict[str, Any]:
    """Publish S bytes on worker 0 and fetch them on workers 1..n; times in seconds since the fetch started."""
    publisher, fetchers = workers[0], workers[1 : n + 1]
    run = f"bench-{'naive' if publisher_only else 'hn'}-n{n}-s{size // MIB}-{int(time.time() * 1000) % 10**8}"
    publisher.send(cmd="publish", run=run, size_bytes=size, seed=n)
    published = publisher.recv(timeout_s=600)
    publisher.send(cmd="stats")
    uploaded_before = publisher.recv(timeout_s=30)["uploaded"]
    lower_bound_s = published["total_bytes"] / args.upload_bytes_per_s
    started = time.time()
    for fetcher in fetchers:
        fetcher.send(cmd="fetch", run=run, publisher_only=publisher_only)
    victims = fetchers[: int(len(fetchers) * kill_fraction)]
    survivors = [f for f in fetchers if f not in victims]

    def maybe_kill(elapsed: float) -> None:
        if victims and victims[0].alive and elapsed > 0.5 * lower_bound_s:
            for victim in victims:
                victim.kill()

    replies = _collect(survivors, timeout_s=max(600.0, 40 * lower_bound_s), on_progress=maybe_kill)
    for victim in victims:  # if they finished before the kill, still kill them: they are gone either way
        victim.kill()
    publisher.send(cmd="stats")
    uploaded = publisher.recv(timeout_s=30)["uploaded"] - uploaded_before
    if not victims:
        for worker in (publisher, *fetchers):
            worker.send(cmd="drop", run=run)
        _collect([publisher, *fetchers], timeout_s=60)
    done_s = sorted(r["at"] - started for r in replies)
    return {
        "time_s": done_s[-1],
        "first_done_s": done_s[0],
        "median_done_s": done_s[len(done_s) // 2],
        "lower_bound_s": lower_bound_s,
        "total_bytes": published["total_bytes"],
        "publisher_upload_bytes": uploaded,
        "all_equal": all(r["sha256"] == published["sha256"] and r["complete"] for r in replies),
        "bad_chunks": sum(r["bad_chunks"] for r in replies),
        "from_publisher": sum(r["from_publisher"] for r in replies)
        / max(1, sum(r["downloaded"] for r in replies)),
        "nodes_done": len(replies),
    }


# ---------------------------------------------------------------------------------------------
# shardcast (runs under the scratch venv's python; imports only shardcast and the stdlib)
# ---------------------------------------------------------------------------------------------


def _throttle_shardcast_uploads(bytes_per_s: float) -> None:
    """Cap this process's HTTP uploads with a token bucket (the same kind hivenet uses)."""
    from http.server import SimpleHTTPRequestHandler

    lock = threading.Lock()
    state = {"tokens": 256 * 1024.0, "updated": time.monotonic()}
    burst = 256 * 1024.0

    def consume(num_bytes: int) -> None:
        with lock:  # FIFO-ish: one upload slice at a time, like hivenet's bucket
            while True:
                now = time.monotonic()
                state["tokens"] = min(burst, state["tokens"] + (now - state["updated"]) * bytes_per_s)
                state["updated"] = now
                if state["tokens"] >= num_bytes:
                    state["tokens"] -= num_bytes
                    return
                time.sleep((num_bytes - state["tokens"]) / bytes_per_s)

    def copyfile(self: Any, source: Any, outputfile: Any) -> None:
        while piece := source.read(64 * 1024):
            consume(len(piece))
            outputfile.write(piece)

    SimpleHTTPRequestHandler.copyfile = copyfile  # type: ignore[method-assign]


def run_shardcast_node(args: argparse.Namespace) -> None:
    """One shardcast node (origin, relay or client), reporting on stdout."""
    import logging

    os.environ.setdefault("SHARDCAST_LOG_LEVEL", "WARNING")
    import shardcast
    import shardcast.client

    logging.getLogger().setLevel(logging.WARNING)
    shardcast.logger.setLevel(logging.WARNING)
    _throttle_shardcast_uploads(args.upload_bytes_per_s)
    workdir = Path(args.sc_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    # shardcast's downloader writes its distribution temp file next to its package: one per process here
    private = workdir / "pkg" / "shardcast"
    private.mkdir(parents=True, exist_ok=True)
    shardcast.client.__file__ = str(private / "client.py")
    (workdir / "data").mkdir(exist_ok=True)
    (workdir / "data" / "data1.bin").write_bytes(b"x" * 1024)  # shardcast probes every server for this file
    if args.shardcast == "origin":
        server = shardcast.OriginServer(str(workdir / "data"), args.port)
        _reply(event="ready")
        command = json.loads(sys.stdin.readline())
        version = server.broadcast(command["file"], shard_size=command["shard_bytes"])
        _reply(event="published", version=version, at=time.time())
        sys.stdin.readline()
        server.shutdown()
    elif args.shardcast == "relay":
        relay = shardcast.MiddleNode(args.upstream, str(workdir / "data"), args.port, check_interval=1)
        _reply(event="ready")
        while not relay.processed_versions:
            time.sleep(0.05)
        _reply(event="fetched", at=time.time())
        sys.stdin.readline()
        relay.shutdown()
    else:
        client = shardcast.ClientNode(args.upstream, str(workdir / "out"))
        _reply(event="ready")
        while True:
            versions = client.list_available_versions()
            if versions:
                version = sorted(versions)[-1]
                path = client.download_version(version)  # verifies the whole-file checksum
                if path is not None:
                    _reply(event="fetched", at=time.time(), sha256=_sha256_file(Path(path)))
                    break
            time.sleep(1.0)
        sys.stdin.readline()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(8 * MIB):
            digest.update(piece)
    return digest.hexdigest()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_shardcast_python(args: Any) -> tuple[str | None, str]:
    """A python with shardcast installed (scratch venv under /tmp), or None and the reason."""
    if args.shardcast_python:
        return args.shardcast_python, ""
    venv = Path(tempfile.gettempdir()) / "hivenet-bench-shardcast-venv"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", f"import shardcast; assert shardcast.__version__ == '{SHARDCAST_VERSION}'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python), ""
    if shutil.which("wget") is None:
        return None, "shardcast shells out to wget, which is not installed"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"shardcast=={SHARDCAST_VERSION}"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return (
            None,
            f"could not install shardcast=={SHARDCAST_VERSION}: {detail.decode(errors='replace')[-300:]}",
        )
    return str(python), ""


def run_shardcast(python: str, n: int, size: int, args: Any, workdir: Path) -> dict[str, Any]:
    """Origin + R relays + (n - R) clients; time from the origin's broadcast to the last verified copy."""
    relays = max(1, n // 4)
    clients = n - relays
    run_dir = workdir / f"shardcast-n{n}-s{size // MIB}"  # fresh folders: no state from an earlier run
    run_dir.mkdir(parents=True)
    data = run_dir / "input.bin"
    with open(data, "wb") as handle:
        handle.write(os.urandom(size))
    expected = _sha256_file(data)
    processes: list[subprocess.Popen[str]] = []

    def spawn(role: str, port: int, upstream: list[str], index: int) -> subprocess.Popen[str]:
        command = [
            python,
            str(Path(__file__).resolve()),
            "--shardcast",
            role,
            "--sc-dir",
            str(run_dir / f"{role}-{index}"),
            "--port",
            str(port),
            "--upload-bytes-per-s",
            str(args.upload_bytes_per_s),
        ]
        for url in upstream:
            command += ["--upstream", url]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(run_dir / f"{role}-{index}.log", "wb"),  # noqa: SIM115
            text=True,
            start_new_session=True,
            cwd=workdir,
        )
        processes.append(process)
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            raise RuntimeError(
                f"shardcast {role} {index} failed to start; see {workdir}/sc-{role}-{index}.log"
            )
        return process

    try:
        origin_port = _free_port()
        origin = spawn("origin", origin_port, [], 0)
        relay_urls = []
        relay_procs = []
        for i in range(relays):
            port = _free_port()
            relay_procs.append(spawn("relay", port, [f"http://127.0.0.1:{origin_port}"], i))
            relay_urls.append(f"http://127.0.0.1:{port}")
        client_procs = [spawn("client", _free_port(), relay_urls, i) for i in range(clients)]
        assert origin.stdin is not None and origin.stdout is not None
        origin.stdin.write(json.dumps({"file": str(data), "shard_bytes": args.chunk_bytes}) + "\n")
        origin.stdin.flush()
        started = json.loads(origin.stdout.readline())["at"]
        replies = []
        deadline = time.monotonic() + max(900.0, 60 * size / args.upload_bytes_per_s)
        for process in [*relay_procs, *client_procs]:
            assert process.stdout is not None
            selector = selectors.DefaultSelector()
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(max(1.0, deadline - time.monotonic())):
                raise TimeoutError("shardcast did not deliver to every node in time")
            replies.append(json.loads(process.stdout.readline()))
        return {
            "time_s": max(r["at"] for r in replies) - started,
            "lower_bound_s": size / args.upload_bytes_per_s,
            "all_equal": all(r.get("sha256", expected) == expected for r in replies),
            "relays": relays,
        }
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(run_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# coordinator
# ---------------------------------------------------------------------------------------------


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
        workers = _start_workers(max(nodes) + 1, workdir, args)
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
