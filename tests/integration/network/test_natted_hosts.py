"""Volunteers behind home routers: each node a `hivenet` process in a network namespace of its own,
public ones on a virtual internet and NATed ones behind routers that let no connection in
(`tests.helpers.netns`). The network stage (`scripts/test.sh network`); needs root, `ip`, `tc` and
`nft` (.ci/run installs them).

What a volunteer behind a home router must get: it joins and sees the swarm, is told that peers
cannot dial it and what to do about it (by `hivenet join` and by `hivenet doctor`), the weight
broadcast reaches it, and as an inference worker its rollouts are accepted and trained on.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.swarm import LocalSwarm, SwarmNode, wait_until
from tests.helpers.netns import Host, Lab, logged
from tests.helpers.paths import REPO
from tests.integration.network.conftest import LAB_NETWORK

pytestmark = pytest.mark.slow

WORKER_GROUP = re.compile(r"group +\d+ \| v(\d+) \| accepted (\d+) \|")


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> Lab:
    lab.public_host("seed")
    lab.public_host("pub")
    lab.host_behind(lab.router("home1"), "nat1")
    lab.host_behind(lab.router("home2"), "nat2")
    # hosts of their own for `hivenet doctor`: a seed answers one dial-back per address a minute
    lab.public_host("probe")
    lab.host_behind(lab.router("home3"), "nat3")
    for name in ("rl-trainer", "rl-validator", "rl-worker"):
        lab.public_host(name)
    lab.host_behind(lab.router("home4"), "rl-natted")
    return lab


@pytest.fixture(scope="module")
def swarm(hosts: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(run_id="netns", workdir=tmp_path_factory.mktemp("netns-swarm")) as started:
        started.start_seed(placement=hosts.hosts["seed"].placement, extra_args=LAB_NETWORK)
        for name in ("pub", "nat1", "nat2"):
            started.add_node(name=name, placement=hosts.hosts[name].placement, extra_args=LAB_NETWORK)
        started.wait_converged()
        yield started


def test_nodes_behind_different_nats_join_and_see_the_whole_swarm(swarm: LocalSwarm) -> None:
    everyone = {node.peer_id for node in swarm.running_nodes()} | {swarm.seed.peer_id}  # type: ignore[union-attr]
    for node in swarm.running_nodes():
        status = node.status()
        assert status is not None and set(status.live_nodes) == everyone, node.log_tail()


def test_join_says_whether_peers_can_dial_the_node_and_what_a_natted_one_can_do(swarm: LocalSwarm) -> None:
    public, natted = swarm.nodes["pub"], swarm.nodes["nat1"]
    assert wait_until(lambda: logged(public, "reachable: "), timeout_s=120), public.log_tail()
    assert wait_until(lambda: logged(natted, "not reachable from outside"), timeout_s=120), natted.log_tail()
    assert not logged(public, "not reachable"), public.log_tail()
    natted_log = natted.log_file.read_text(errors="replace")
    assert "--auto-relay" in natted_log and "Traceback" not in natted_log


def _doctor(host: Host, seed: str, workdir: Path) -> dict[str, dict[str, object]]:
    result = subprocess.run(
        [*host.prefix, sys.executable, "-m", "cli.main", "doctor", "--json", "--initial-peers", seed,
         "--host", host.ip, "--identity", str(workdir / f"doctor-{host.name}.key")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    return {check["name"]: check for check in report["checks"]}


def test_doctor_on_a_natted_host_says_it_is_unreachable_and_how_to_fix_it(
    hosts: Lab, swarm: LocalSwarm, tmp_path: Path
) -> None:
    lab = hosts
    natted = _doctor(lab.hosts["nat3"], swarm.seed_multiaddr, tmp_path)
    assert natted["dial-back"]["ok"] is False, natted
    assert "--auto-relay" in str(natted["dial-back"]["fix"]), natted
    public = _doctor(lab.hosts["probe"], swarm.seed_multiaddr, tmp_path)
    assert public["dial-back"]["ok"] is True, public


def test_the_weight_broadcast_reaches_hosts_behind_nat(hosts: Lab, tmp_path: Path) -> None:
    """A version published on a public host is fetched, verified and identical, on two hosts behind
    two different NATs, which can dial out but cannot be dialled."""
    import torch
    from safetensors.torch import load_file, save_file

    from node.identity import create_identity

    weights_file = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(300, 400), "b": torch.arange(9)}, str(weights_file))
    publisher_id = create_identity(tmp_path / "pub.key").peer_id.to_base58()
    lab = hosts
    pub = lab.hosts["pub"]
    publisher = subprocess.Popen(
        [*pub.prefix, sys.executable, "-m", "cli.main", "weights", "publish", str(weights_file), "--run", "lab",
         "--version", "1", "--identity", str(tmp_path / "pub.key"), "--host", pub.ip, "--chunk-bytes", "65536",
         "--serve-for", "300"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert publisher.stdout is not None
        address = publisher.stdout.readline().strip()  # printed once it serves
        assert address.endswith(publisher_id), address
        fetchers = {
            name: _fetch(lab.hosts[name], address, publisher_id, tmp_path / name) for name in ("nat1", "nat2")
        }
        want = load_file(str(weights_file))
        for name, fetcher in fetchers.items():
            _, stderr = fetcher.communicate(timeout=300)
            assert fetcher.returncode == 0 and "Traceback" not in stderr, stderr
            got = load_file(str(tmp_path / name / "lab-v1.safetensors"))
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    finally:
        publisher.terminate()
        publisher.wait(timeout=60)


def _fetch(host: Host, address: str, publisher_id: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*host.prefix, sys.executable, "-m", "cli.main", "weights", "fetch", "--run", "lab", "--out", str(out),
         "--initial-peers", address, "--publisher", publisher_id, "--host", host.ip],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.timeout(900)
def test_an_inference_worker_behind_nat_has_its_rollouts_accepted_and_trained_on(
    hosts: Lab, tmp_path: Path
) -> None:
    """An RL run on public hosts (trainer, validator, one inference worker) and one inference worker
    behind a NAT: the NATed worker fetches the policy, submits rollouts, and has groups accepted on
    a policy version past the first, i.e. after the trainer trained on accepted rollouts."""
    from node.identity import create_identity

    trainer_id = create_identity(tmp_path / "trainer.key").peer_id.to_base58()
    validator_id = create_identity(tmp_path / "validator.key").peer_id.to_base58()
    common = ["--rl", "--trusted-validator", validator_id, *LAB_NETWORK]
    lab = hosts
    with LocalSwarm(run_id="netns-rl", workdir=tmp_path) as rl:
        rl.start_seed(placement=lab.hosts["seed"].placement, extra_args=LAB_NETWORK)
        rl.add_node(
            name="trainer", roles=["trainer"], wait=False, identity_path=tmp_path / "trainer.key",
            placement=lab.hosts["rl-trainer"].placement, extra_args=common,
        )  # fmt: skip
        rl.add_node(
            name="validator", roles=["validator"], wait=False, identity_path=tmp_path / "validator.key",
            placement=lab.hosts["rl-validator"].placement, extra_args=[*common, "--publisher", trainer_id],
        )  # fmt: skip
        for name, host in (("public", "rl-worker"), ("natted", "rl-natted")):
            rl.add_node(
                name=name, roles=["inference"], wait=False, placement=lab.hosts[host].placement,
                extra_args=[*common, "--publisher", trainer_id],
            )  # fmt: skip
        natted = rl.nodes["natted"]

        def accepted_past_first(node: SwarmNode) -> bool:
            text = node.log_file.read_text(errors="replace")
            return any(int(v) > 1 and int(n) > 0 for v, n in WORKER_GROUP.findall(text))

        def report() -> str:
            return "\n\n".join(f"--- {n.name}\n{n.log_tail(30)}" for n in rl.nodes.values())

        assert wait_until(lambda: accepted_past_first(natted), timeout_s=600), report()
        assert logged(natted, "not reachable from outside"), report()
