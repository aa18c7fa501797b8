"""The hivenet side of the broadcast benchmark: node processes and one measured publish/fetch round.

`run_worker` is a hivenet node process (its own DHT and p2pd, running `WeightBroadcast`) driven
by JSON commands on stdin; `Worker` is the coordinator's handle on one, `start_workers` starts
the publisher and the fetchers, and `run_hivenet` times one version's delivery (optionally
publisher-only, the naive baseline, or with a fraction of the fetchers SIGKILLed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._broadcast_common import MIB, ROOT, SCRIPT, reply, sha256_file
from node.swarm import LOOPBACK, Placement


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
    dht = start_loopback_dht(args.initial_peers, identity=identity, listen_ip=args.listen_ip)

    tuning = {"upload_slots": args.upload_slots, "max_inflight_per_peer": args.max_inflight_per_peer}

    async def main() -> None:
        config = BroadcastConfig(
            store_dir=Path(args.store),
            authorized_publishers=[args.publisher],
            chunk_bytes=args.chunk_bytes,
            upload_bytes_per_s=args.upload_bytes_per_s or None,
            keep_versions=1,
            holder_refresh_s=0.5,
            holder_ttl_s=30.0,
            retry_after_failure_s=2.0,
            request_timeout_s=30.0,
            **{k: v for k, v in tuning.items() if v is not None},
        )
        broadcast = WeightBroadcast(dht=dht, identity=identity, config=config)
        await broadcast.start()
        reply(
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
                reply(
                    event="published",
                    sha256=_file_sha256(broadcast, command["run"]),
                    total_bytes=manifest.total_bytes,
                )
            elif kind == "fetch":
                broadcast.config.publisher_only = bool(command["publisher_only"])
                entry = await broadcast.fetch(command["run"], 1)
                done = time.time()
                fetcher = broadcast.last_fetch
                reply(
                    event="fetched",
                    at=done,
                    downloaded=fetcher.bytes_downloaded if fetcher else 0,
                    from_publisher=fetcher.bytes_by_source[fetcher.publisher.to_bytes()] if fetcher else 0,
                    bad_chunks=fetcher.bad_chunks if fetcher else 0,
                    sha256=_file_sha256(broadcast, command["run"]),
                    complete=entry.complete,
                )
            elif kind == "stats":
                reply(event="stats", uploaded=broadcast.service.uploaded_bytes)
            elif kind == "drop":
                for version in broadcast.store.versions(command["run"]):
                    broadcast.service.withdraw(command["run"], version)
                    broadcast.store.remove(command["run"], version)
                reply(event="dropped")
            elif kind == "quit":
                break
        await broadcast.stop()

    try:
        asyncio.run(main())
    finally:
        dht.shutdown()


def _file_sha256(broadcast: Any, run: str) -> str:
    return sha256_file(broadcast.store.get(run, 1).data_path)


class Worker:
    """The coordinator's handle on one worker process."""

    def __init__(
        self,
        index: int,
        workdir: Path,
        publisher_id: str,
        initial_peers: list[str],
        args: Any,
        placement: Placement = LOOPBACK,
    ) -> None:
        """`placement`: the host it runs on (`node.swarm.Placement`; a lab's network namespace)."""
        self.index = index
        command = [
            *placement.launcher,
            sys.executable,
            str(SCRIPT),
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
            str(args.app_upload_bytes_per_s or 0),
            "--listen-ip",
            placement.ip,
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


def start_workers(
    count: int, workdir: Path, args: Any, placements: Sequence[Placement] | None = None
) -> list[Worker]:
    """Worker 0 (the publisher) and `count - 1` fetchers joined to it, worker i on `placements[i]`
    (default: all on loopback)."""
    from node.identity import create_identity

    where = list(placements) if placements is not None else [LOOPBACK] * count
    publisher_id = create_identity(workdir / "id0.key").peer_id.to_base58()
    workers = [Worker(0, workdir, publisher_id, [], args, where[0])]
    ready = workers[0].recv(timeout_s=180)
    seeds = [m if "/p2p/" in m else f"{m}/p2p/{ready['peer_id']}" for m in ready["maddrs"]]
    workers += [Worker(i, workdir, publisher_id, seeds, args, where[i]) for i in range(1, count)]
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
