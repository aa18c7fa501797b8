"""Membership on a real local swarm (seed + nodes as separate processes on 127.0.0.1).

Discovery with roles, the `peers` and `doctor` commands, clean leave, abrupt kill, seed
restarts keeping their address, unreachable seeds and duplicate identities.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from node.config import load_config
from node.identity import create_identity
from node.membership import fetch_run_records
from node.node import HivenetNode
from node.reachability import call_dial_back
from node.runtime import in_dht
from node.status import read_status_file
from node.swarm import LocalSwarm, wait_until
from protocol.node_record import NodeStatus, Role
from tests.helpers.paths import REPO

RUN = "itest"
TTL_S = 8.0
REFRESH_S = 2.0


def hivenet(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO
    )


@pytest.fixture(scope="module")
def swarm() -> Iterator[LocalSwarm]:
    with LocalSwarm(run_id=RUN, record_ttl_s=TTL_S, refresh_interval_s=REFRESH_S) as local:
        local.start(3)  # relays: the role of a node of a run that is not RL
        yield local


@pytest.fixture(scope="module")
def observer(swarm: LocalSwarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HivenetNode]:
    """An unannounced client node in the test process, to look at the swarm from outside."""
    tmp = tmp_path_factory.mktemp("observer")
    config = load_config(
        identity_path=tmp / "obs.key",
        host="127.0.0.1",
        initial_peers=[swarm.seed_multiaddr],
        run_id=RUN,
        bootstrap_timeout_s=20,
    )
    client = HivenetNode(config, announce=False, client_mode=True)
    client.start()
    yield client
    client.stop()


def _live_ids(observer: HivenetNode) -> set[str]:
    return {node.peer_id.to_base58() for node in observer.discover()}


def _dial_back(observer: HivenetNode, seeds: list[str], addresses: list[str]) -> tuple[bool, str]:
    assert observer.dht is not None
    return observer.call(in_dht(observer.dht, call_dial_back, seeds=seeds, addresses=addresses), timeout_s=60)


def test_seed_and_three_nodes_discover_each_other_with_roles(
    swarm: LocalSwarm, observer: HivenetNode
) -> None:
    assert swarm.seed is not None
    expected = {node.peer_id for node in swarm.nodes.values()} | {swarm.seed.peer_id}
    for node in swarm.nodes.values():  # every node sees every other (the harness waited for exactly this)
        status = node.status()
        assert status is not None and set(status.live_nodes) == expected
    assert wait_until(lambda: _live_ids(observer) == expected, timeout_s=30)
    roles = {node.peer_id.to_base58(): node.record.roles for node in observer.discover()}
    assert all(roles[node.peer_id] == (Role.RELAY,) for node in swarm.nodes.values())
    assert roles[swarm.seed.peer_id] == (Role.SEED,)
    assert [n.peer_id.to_base58() for n in observer.discover(Role.SEED)] == [swarm.seed.peer_id]
    relays = {n.peer_id.to_base58(): n.record for n in observer.discover(Role.RELAY)}
    assert set(relays) == {node.peer_id for node in swarm.nodes.values()}
    record = relays[swarm.nodes["node2"].peer_id]
    assert record.public_name == "node2" and record.software_version and record.capabilities.cpu_count >= 1
    assert any(address.startswith("/ip4/127.0.0.1/tcp/") for address in record.addresses)


def test_peers_command_lists_the_swarm(swarm: LocalSwarm) -> None:
    result = hivenet("peers", "--initial-peers", swarm.seed_multiaddr, "--run", RUN, "--json")
    assert result.returncode == 0, result.stderr
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert {"node1", "node2", "node3"} <= set(listed)
    assert listed["node2"]["roles"] == ["relay"]
    assert listed["node2"]["reachability"] == "unknown"  # every seed is on loopback: no dial-back check
    table = hivenet("peers", "--initial-peers", swarm.seed_multiaddr, "--run", RUN, "--role", "seed")
    assert table.returncode == 0 and "live nodes of run 'itest': 1" in table.stdout
    assert "node1" not in table.stdout
    assert "reachable" in table.stdout


def test_doctor_reports_reachable_seed_and_insecure_key(swarm: LocalSwarm, tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    create_identity(key)
    key.chmod(0o644)
    result = hivenet(
        "doctor", "--initial-peers", swarm.seed_multiaddr, "--identity", str(key), "--host", "127.0.0.1"
    )
    assert result.returncode == 1  # the insecure key is a failure
    assert "chmod 600" in result.stdout
    seed_line = next(line for line in result.stdout.splitlines() if "seed" in line and "reachable" in line)
    assert seed_line.startswith("ok")
    assert any(line.startswith("ok") and "dial-back" in line for line in result.stdout.splitlines())


def test_dial_back_service_answers_truthfully(swarm: LocalSwarm, observer: HivenetNode) -> None:
    dead = f"/ip4/127.0.0.1/tcp/{_free_port()}"
    reachable, detail = _dial_back(observer, [swarm.seed_multiaddr], [dead])
    assert not reachable and "DIAL_BACK_UNREACHABLE" in detail, (dead, detail)
    # the same requester asking again at once is rate-limited, and a malformed request is refused
    again, detail = _dial_back(observer, [swarm.seed_multiaddr], [dead])
    assert not again and "RATE_LIMITED" in detail
    bad, detail = _dial_back(observer, [swarm.seed_multiaddr], ["/ip4/1.2.3.4/udp/1"])
    assert not bad and "BAD_REQUEST" in detail
    # the seed dials only the address the request came from, never a third party
    third, detail = _dial_back(observer, [swarm.seed_multiaddr], [f"/ip4/127.0.0.2/tcp/{_free_port()}"])
    assert not third and "BAD_REQUEST" in detail and "not the address this request came from" in detail


def test_clean_leave_withdraws_the_record_at_once(swarm: LocalSwarm, observer: HivenetNode) -> None:
    name = swarm.add_node()
    peer_id = swarm.nodes[name].peer_id
    assert wait_until(lambda: peer_id in _live_ids(observer), timeout_s=30)
    swarm.stop_node(name)
    final = swarm.nodes[name].status()
    assert final is not None and final.state == "stopped"  # not left at "leaving" after exit
    records = {
        node.peer_id.to_base58(): node
        for node in observer.call(fetch_run_records(observer.dht, RUN)).values()
    }
    assert records[peer_id].record.status == NodeStatus.LEFT  # not merely waiting for expiry
    assert peer_id not in _live_ids(observer)


def test_killed_node_disappears_within_one_ttl(swarm: LocalSwarm, observer: HivenetNode) -> None:
    name = swarm.add_node(roles=["relay"])
    peer_id = swarm.nodes[name].peer_id
    assert wait_until(lambda: peer_id in _live_ids(observer), timeout_s=30)
    swarm.kill_node(name)
    killed_at = time.time()
    # its last record was published before the kill, so it expires at most one TTL from now;
    # the margin covers one discovery round trip
    assert wait_until(lambda: peer_id not in _live_ids(observer), timeout_s=TTL_S + 3.0)
    assert time.time() - killed_at <= TTL_S + 3.0
    others = {n.peer_id for n in swarm.running_nodes()}
    assert others <= _live_ids(observer)  # the rest of the swarm is unaffected


def test_second_node_with_same_identity_file_is_refused(swarm: LocalSwarm) -> None:
    node1 = swarm.nodes["node1"]
    result = hivenet(
        "join",
        "--initial-peers",
        swarm.seed_multiaddr,
        "--identity",
        str(node1.identity_path),
        "--run",
        RUN,
        "--host",
        "127.0.0.1",
    )
    assert result.returncode == 1
    assert "already in use" in result.stderr and "Traceback" not in result.stderr


def test_copied_identity_on_another_machine_is_refused(swarm: LocalSwarm, tmp_path: Path) -> None:
    node1 = swarm.nodes["node1"]
    copy = tmp_path / "copied.key"
    shutil.copy(node1.identity_path, copy)  # no shared lock file: only the swarm can tell
    copy.chmod(0o600)
    result = hivenet(
        "join",
        "--initial-peers",
        swarm.seed_multiaddr,
        "--identity",
        str(copy),
        "--run",
        RUN,
        "--host",
        "127.0.0.1",
        "--refresh-interval",
        str(REFRESH_S),
        "--record-ttl",
        str(TTL_S),
    )
    assert result.returncode == 1, result.stderr
    assert "already used by a running node" in result.stderr and "node1" in result.stderr
    assert node1.alive
    assert node1.peer_id in (node1.status() or pytest.fail("node1 lost its status")).live_nodes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_seed_is_reported_by_name_in_bounded_time(tmp_path: Path) -> None:
    dead_seed = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/12D3KooWJUW8TJkrraxJRkC9EqBfTAGLumGNHJczTAy783LYjpkV"
    result = hivenet(
        "join",
        "--initial-peers",
        dead_seed,
        "--identity",
        str(tmp_path / "k"),
        "--host",
        "127.0.0.1",
        "--bootstrap-timeout",
        "3",
        timeout_s=60,
    )
    assert result.returncode == 1
    assert "could not reach any of the 1 initial peer(s)" in result.stderr and dead_seed in result.stderr
    assert "Traceback" not in result.stderr


def _http_status(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def test_seed_restart_keeps_its_multiaddr_and_serves_health(tmp_path: Path) -> None:
    port, status_port = _free_port(), _free_port()
    status_file = tmp_path / "seed.json"
    addresses = []
    for _ in range(2):
        command = [
            sys.executable, "-m", "cli.main", "seed", "--identity", str(tmp_path / "seed.key"), "--port", str(port),
            "--host", "127.0.0.1", "--status-file", str(status_file), "--status-port", str(status_port),
        ]  # fmt: skip
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            assert wait_until(
                lambda: (s := read_status_file(status_file)) is not None and s.state == "running", 60
            )
            status = read_status_file(status_file)
            assert status is not None
            addresses.append(status.multiaddrs)
            health = _http_status(status_port)
            assert health is not None and health["state"] == "running" and health["roles"] == ["seed"]
            assert health["multiaddrs"] == status.multiaddrs
        finally:
            process.send_signal(2)
            out, _ = process.communicate(timeout=60)
        assert status.multiaddrs[0] in out  # printed for others to copy into --initial-peers
        status_file.unlink()
    assert addresses[0] == addresses[1]
    assert addresses[0][0].startswith(f"/ip4/127.0.0.1/tcp/{port}/p2p/12D3KooW")


def test_ctrl_c_while_dialling_seeds_stops_at_once(tmp_path: Path) -> None:
    """The stop request reaches the bootstrap loop: Ctrl-C does not wait out the bootstrap timeout."""
    import signal

    dead_seed = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/12D3KooWJUW8TJkrraxJRkC9EqBfTAGLumGNHJczTAy783LYjpkV"
    status_file = tmp_path / "status.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "join", "--initial-peers", dead_seed, "--identity", str(tmp_path / "k"),
         "--host", "127.0.0.1", "--bootstrap-timeout", "600", "--status-file", str(status_file)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # the node writes no status until it has joined: wait for its p2pd, after which it dials the seed
        def dialling() -> bool:
            try:
                return any(
                    "p2pd" in child.name() for child in psutil.Process(process.pid).children(recursive=True)
                )
            except psutil.Error:
                return False

        assert wait_until(dialling, timeout_s=60)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)  # far below the 600 s bootstrap timeout
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert process.returncode != 0 and "Traceback" not in stderr, stderr


def test_join_checks_that_peers_can_reach_it_and_signs_the_seed_a_dial_back_receipt(
    swarm: LocalSwarm, tmp_path: Path
) -> None:
    """`--reachability-check on` (auto skips a loopback swarm): the joined node asks the seed to dial it
    back, prints the outcome, and its ledger keeps the receipt it signed for the seed."""
    import signal
    import threading

    from node.ledger import Ledger
    from node.receipts.seeds import seed_peer_id
    from protocol import receipts_pb2
    from protocol.receipts import ReceiptKind

    ledger_path = tmp_path / "ledger.db"
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "join", "--initial-peers", swarm.seed_multiaddr, "--identity",
         str(tmp_path / "k"), "--host", "127.0.0.1", "--run", RUN, "--ledger", str(ledger_path),
         "--reachability-check", "on"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    stderr = process.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")), daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: any("reachable:" in line for line in lines), timeout_s=120), "".join(lines)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    output = "".join(lines)
    assert "[green]" not in output and "reachable: seed" in output and "not reachable" not in output, output
    assert process.returncode == 0 and "Traceback" not in output, output
    with Ledger(ledger_path, RUN) as ledger:
        dial_backs = [
            receipt
            for receipt in ledger.receipts()
            if receipt.kind == ReceiptKind.SEED and receipt.step == receipts_pb2.SEED_SERVICE_DIAL_BACK
        ]
    assert [receipt.contributor for receipt in dial_backs] == [seed_peer_id(swarm.seed_multiaddr)]
