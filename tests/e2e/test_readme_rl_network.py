"""The README's hand-run RL network, run line by line as a user would type it (issue 28).

Tried by hand, such a network once made no progress and said nothing: processes on one machine
shared their weights directory and ledger, a lone RL trainer judged nothing, and the
trainer-validator PeerID cycle had no documented way out. This test takes the README's block
after the `<!-- hand-run RL network -->` marker, runs each `hivenet` line in one directory as its
own process (the only change: the seed's port, which must be free here, and the placeholders
TRAINER, VALIDATOR and SEED, filled with what the earlier lines printed), and checks that the run
learns: the trainer publishes new policy versions, both workers have groups accepted on a version
past the first, and the standalone validator judges some of them.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from node.swarm import wait_until
from tests.helpers.paths import REPO

MARKER = "<!-- hand-run RL network -->"
PEER_ID = re.compile(r"12D3KooW[1-9A-HJ-NP-Za-km-z]{44}")
SEED_ADDRESS = re.compile(r"/ip4/127\.0\.0\.1/tcp/\d+/p2p/12D3KooW[1-9A-HJ-NP-Za-km-z]{44}")
TRAINER_STEP = re.compile(r"step +\d+ \| v(\d+) \|")
WORKER_GROUP = re.compile(r"group +\d+ \| v(\d+) \| accepted (\d+) \|.* validator (\S+)")


def readme_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    assert MARKER in text, f"the README lost its {MARKER} block"
    block = text.split(MARKER, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Terminals:
    """One process per README line, each with its own log, all in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200",
        }  # fmt: skip

    def argv(self, line: str) -> list[str]:
        words = line.split()
        assert words[0] == "hivenet", line
        return [sys.executable, "-m", "cli.main", *words[1:]]

    def run(self, line: str) -> str:
        done = subprocess.run(
            self.argv(line), cwd=self.workdir, env=self.env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done.stdout.decode() + done.stderr.decode()

    def start(self, name: str, line: str) -> None:
        with open(self.log_path(name), "wb") as log:
            self.processes[name] = subprocess.Popen(
                self.argv(line), cwd=self.workdir, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def log(self, name: str) -> str:
        return self.log_path(name).read_text(errors="replace")

    def alive(self, name: str) -> bool:
        return self.processes[name].poll() is None

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@contextmanager
def terminals(workdir: Path) -> Iterator[Terminals]:
    opened = Terminals(workdir)
    try:
        yield opened
    finally:
        opened.stop_all()


def test_the_readme_block_parses_into_keys_a_seed_and_four_nodes() -> None:
    lines = readme_lines()
    assert [line.split()[1] for line in lines] == ["identity", "identity", "seed", *["join"] * 4]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_rl_network_learns_as_written(tmp_path: Path) -> None:
    lines = readme_lines()
    filled: dict[str, str] = {}
    with terminals(tmp_path) as t:
        for line in lines:
            words = line.split()
            line = " ".join(filled.get(word, word) for word in words)
            if words[1] == "identity":
                (peer_id,) = set(PEER_ID.findall(t.run(line)))
                filled["TRAINER" if "trainer.key" in words else "VALIDATOR"] = peer_id
            elif words[1] == "seed":
                port = words[words.index("--port") + 1]
                t.start("seed", line.replace(f"--port {port}", f"--port {_free_port()}"))
                assert wait_until(lambda: bool(SEED_ADDRESS.search(t.log("seed"))), 60), t.log("seed")
                filled["SEED"] = SEED_ADDRESS.findall(t.log("seed"))[0]
            else:
                role = words[words.index("--role") + 1]
                key = words[words.index("--identity") + 1]
                t.start(key.removesuffix(".key") if role == "inference" else role, line)
        assert set(filled) == {"TRAINER", "VALIDATOR", "SEED"}
        nodes = ["trainer", "validator", "worker1", "worker2"]

        def versions() -> list[int]:
            return [int(v) for v in TRAINER_STEP.findall(t.log("trainer"))]

        def accepted(worker: str) -> list[tuple[int, str]]:
            return [(int(v), who) for v, n, who in WORKER_GROUP.findall(t.log(worker)) if int(n) > 0]

        def learning() -> bool:
            assert all(t.alive(n) for n in nodes), {n: t.log(n)[-3000:] for n in nodes if not t.alive(n)}
            return max(versions(), default=0) >= 3 and all(
                any(v >= 2 for v, _ in accepted(w)) for w in ("worker1", "worker2")
            )

        assert wait_until(learning, 600), {n: t.log(n)[-3000:] for n in nodes}
        standalone = filled["VALIDATOR"][-8:]
        assert wait_until(
            lambda: any(who == standalone for w in ("worker1", "worker2") for _, who in accepted(w)), 300
        ), {w: t.log(w)[-3000:] for w in ("worker1", "worker2")}
        # every node kept its state beside its own key: none shares another's
        for key in ("trainer", "validator", "worker1", "worker2"):
            assert (tmp_path / f"{key}-state").is_dir(), sorted(p.name for p in tmp_path.iterdir())
