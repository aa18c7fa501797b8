"""A local swarm: one seed and N nodes, each a real `hivenet` process, on 127.0.0.1 or each on a
host of its own (a `Placement`: a network namespace of the tests' lab, `tests.helpers.netns`).

Used by the integration tests and by `hivenet simulate`. Every node runs in its own
process group, so `kill_node` (SIGKILL: no goodbye) and `stop_node` (SIGINT: clean leave)
behave exactly as they would for a volunteer, and `close()` tears down precisely the
processes this harness started, also when a test fails or the user presses Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from node.status import NodeStatusSnapshot, read_status_file
from protocol.errors import HivenetError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the harness dies, so no node outlives it.

    The node's own DHT child then notices its parent is gone and takes p2pd down with it.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Placement:
    """Where a swarm process runs: the command prefix that puts it on its host (e.g. `ip netns exec
    NAME` for a network namespace) and the IP it listens on there."""

    launcher: tuple[str, ...] = ()
    ip: str = "127.0.0.1"


LOOPBACK = Placement()
"""This machine's own network stack, every node on 127.0.0.1."""


class SwarmError(HivenetError):
    """A local swarm node failed to start or to converge in time."""


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `predicate` until it is true or `timeout_s` passes; return whether it became true."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


@dataclass
class SwarmNode:
    """One process of the swarm and where it reports its status."""

    name: str
    process: subprocess.Popen[bytes]
    status_file: Path
    log_file: Path
    identity_path: Path
    roles: list[str] = field(default_factory=list)

    def status(self) -> NodeStatusSnapshot | None:
        return read_status_file(self.status_file)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def peer_id(self) -> str:
        status = self.status()
        if status is None:
            raise SwarmError(f"{self.name} has not reported its status yet")
        return status.peer_id

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class LocalSwarm:
    """Start a seed plus nodes as subprocesses on 127.0.0.1; use as a context manager."""

    def __init__(
        self,
        *,
        run_id: str = "local",
        record_ttl_s: float = 8.0,
        refresh_interval_s: float = 2.0,
        workdir: Path | None = None,
        start_timeout_s: float = 60.0,
    ):
        self.run_id = run_id
        self.record_ttl_s = record_ttl_s
        self.refresh_interval_s = refresh_interval_s
        self.start_timeout_s = start_timeout_s
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="hivenet-swarm-"))
        self.seed: SwarmNode | None = None
        self.nodes: dict[str, SwarmNode] = {}
        self._counter = 0

    # lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, num_nodes: int, roles: list[str] | None = None) -> LocalSwarm:
        """Start the seed, then `num_nodes` nodes (roles round-robin), and wait until all see all."""
        try:
            self.start_seed()
            names = [
                self.add_node(roles=[(roles or ["relay"])[i % len(roles or ["relay"])]], wait=False)
                for i in range(num_nodes)
            ]
            for name in names:
                self._wait_started(self.nodes[name])
            self.wait_converged()
        except BaseException:
            self.close()
            raise
        return self

    def start_seed(
        self, *, placement: Placement = LOOPBACK, extra_args: list[str] | None = None
    ) -> SwarmNode:
        self.seed = self._spawn(
            "seed", ["seed", "--port", "0", *(extra_args or [])], roles=["seed"], placement=placement
        )
        self._wait_started(self.seed)
        return self.seed

    @property
    def seed_multiaddr(self) -> str:
        assert self.seed is not None, "start the seed first"
        status = self.seed.status()
        assert status is not None
        return status.multiaddrs[0]

    def add_node(
        self,
        *,
        roles: list[str] | None = None,
        wait: bool = True,
        name: str | None = None,
        identity_path: Path | None = None,
        extra_args: list[str] | None = None,
        placement: Placement = LOOPBACK,
    ) -> str:
        """Start one more node (on `placement`'s host); returns its name (wait=True also waits until
        it has joined)."""
        self._counter += 1
        name = name or f"node{self._counter}"
        args = ["join", "--initial-peers", self.seed_multiaddr, "--public-name", name]
        for role in roles or ["relay"]:
            args += ["--role", role]
        node = self._spawn(
            name,
            args + (extra_args or []),
            roles=roles or ["relay"],
            identity_path=identity_path,
            placement=placement,
        )
        self.nodes[name] = node
        if wait:
            self._wait_started(node)
        return name

    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        roles: list[str],
        identity_path: Path | None = None,
        placement: Placement = LOOPBACK,
    ) -> SwarmNode:
        status_file = self.workdir / f"{name}.status.json"
        log_file = self.workdir / f"{name}.log"
        identity_path = identity_path or self.workdir / f"{name}.key"
        status_file.unlink(missing_ok=True)
        command = [
            *placement.launcher,
            sys.executable,
            "-m",
            "cli.main",
            *args,
            "--identity",
            str(identity_path),
            "--host",
            placement.ip,
            "--run",
            self.run_id,
            "--record-ttl",
            str(self.record_ttl_s),
            "--refresh-interval",
            str(self.refresh_interval_s),
            "--bootstrap-timeout",
            "20",
            "--status-file",
            str(status_file),
            "--weights-dir",
            str(self.workdir / f"{name}.weights"),
            "--ledger",
            str(self.workdir / f"{name}.ledger.db"),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        with open(log_file, "wb") as log:
            process = subprocess.Popen(
                command,
                preexec_fn=_die_with_parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=Path(__file__).resolve().parent.parent,
            )
        return SwarmNode(name, process, status_file, log_file, identity_path, roles)

    def _wait_started(self, node: SwarmNode) -> None:
        def started() -> bool:
            if not node.alive:
                raise SwarmError(
                    f"{node.name} exited with code {node.process.returncode}:\n{node.log_tail()}"
                )
            status = node.status()
            return status is not None and status.state == "running" and status.record_published

        if not wait_until(started, self.start_timeout_s):
            raise SwarmError(
                f"{node.name} did not start within {self.start_timeout_s:.0f} s:\n{node.log_tail()}"
            )

    def wait_converged(self, timeout_s: float | None = None) -> None:
        """Wait until every running node (and the seed) discovers every other running node."""

        def converged() -> bool:
            expected = {n.peer_id for n in self.running_nodes()}
            if self.seed is not None:
                expected.add(self.seed.peer_id)
            for node in self.running_nodes():
                status = node.status()
                if status is None or set(status.live_nodes) != expected:
                    return False
            return True

        if not wait_until(converged, timeout_s or self.start_timeout_s):
            views = {
                n.name: len((n.status() or NodeStatusSnapshot.model_construct(live_nodes=[])).live_nodes)
                for n in self.running_nodes()
            }
            raise SwarmError(f"swarm did not converge: nodes seen per node {views}")

    def running_nodes(self) -> list[SwarmNode]:
        return [node for node in self.nodes.values() if node.alive]

    # fault injection -------------------------------------------------------------------
    def kill_node(self, name: str) -> None:
        """Kill a node abruptly: SIGKILL to the node and every process under it, no goodbye."""
        node = self.nodes[name]
        self._kill_tree(node)
        node.process.wait(timeout=30)

    def stop_node(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop a node cleanly (SIGINT, as Ctrl-C would): it withdraws its record and exits."""
        node = self.nodes[name]
        node.process.send_signal(signal.SIGINT)
        try:
            node.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_tree(node)
            node.process.wait(timeout=30)
            raise SwarmError(f"{name} did not leave within {timeout_s:.0f} s:\n{node.log_tail()}") from None

    @staticmethod
    def _kill_tree(node: SwarmNode) -> None:
        """SIGKILL the node's process and all its descendants (its DHT runs in a process group of its own)."""
        try:
            descendants = psutil.Process(node.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        for process in [*descendants]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop every process this swarm started (nodes first, then the seed) and remove its files."""
        everyone = list(self.nodes.values()) + ([self.seed] if self.seed else [])
        for node in everyone:
            if node.alive:
                node.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 15
        for node in everyone:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            self._kill_tree(node)  # a node that did not leave in time
            if node.process.poll() is None:
                node.process.wait(timeout=30)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
