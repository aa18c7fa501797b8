"""The SHARDCAST baseline of the broadcast benchmark: origin, relays and clients under the same upload cap.

`ensure_shardcast_python` provides a scratch venv with `shardcast` (never the project's venv);
`run_shardcast_node` is one shardcast process (run under that venv's python, so it imports only
shardcast and the standard library) with its HTTP uploads capped by a token bucket; and
`run_shardcast` times an origin + R relays + (N - R) clients delivering one file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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

from bench._broadcast_common import MIB, SCRIPT, reply, sha256_file

SHARDCAST_VERSION = "0.3.2"


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
        reply(event="ready")
        command = json.loads(sys.stdin.readline())
        version = server.broadcast(command["file"], shard_size=command["shard_bytes"])
        reply(event="published", version=version, at=time.time())
        sys.stdin.readline()
        server.shutdown()
    elif args.shardcast == "relay":
        relay = shardcast.MiddleNode(args.upstream, str(workdir / "data"), args.port, check_interval=1)
        reply(event="ready")
        while not relay.processed_versions:
            time.sleep(0.05)
        reply(event="fetched", at=time.time())
        sys.stdin.readline()
        relay.shutdown()
    else:
        client = shardcast.ClientNode(args.upstream, str(workdir / "out"))
        reply(event="ready")
        while True:
            versions = client.list_available_versions()
            if versions:
                version = sorted(versions)[-1]
                path = client.download_version(version)  # verifies the whole-file checksum
                if path is not None:
                    reply(event="fetched", at=time.time(), sha256=sha256_file(Path(path)))
                    break
            time.sleep(1.0)
        sys.stdin.readline()


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
    expected = sha256_file(data)
    processes: list[subprocess.Popen[str]] = []

    def spawn(role: str, port: int, upstream: list[str], index: int) -> subprocess.Popen[str]:
        command = [
            python,
            str(SCRIPT),
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
