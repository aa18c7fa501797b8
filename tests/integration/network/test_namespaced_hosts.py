"""Nodes on separate hosts: each a `hivenet` process in a network namespace of its own, public ones
on a virtual internet and NATed ones behind home routers that let no connection in
(`tests.helpers.netns`). Slow tier; needs root, `ip`, `tc` and `nft` (.ci/run installs them).

What a volunteer behind a home router must get: it joins and sees the swarm, is told that peers
cannot dial it and what to do about it (by `hivenet join` and by `hivenet doctor`), and the
weight broadcast reaches it.
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
from tests.helpers.netns import INTERNET, Host, Lab, skip_reason
from tests.helpers.paths import REPO

pytestmark = pytest.mark.slow

LAB_NETWORK = ["--dialable-network", str(INTERNET)]
TINY_TRAINER = ["--inner-steps", "5", "--seq-len", "32", "--batch-size", "4"]
WORKER_GROUP = re.compile(r"group +\d+ \| v(\d+) \| accepted (\d+) \|")
STEP = re.compile(r"outer step +(\d+) \|.*\| peers (\d+) \|.*\| state (\w+)(.*)")
"""The lab's internet is a private range: the seed is told to treat it as public."""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
    with Lab() as built:
        built.public_host("seed")
        built.public_host("pub")
        built.host_behind(built.router("home1"), "nat1")
        built.host_behind(built.router("home2"), "nat2")
        # hosts of their own for `hivenet doctor`: a seed answers one dial-back per address a minute
        built.public_host("probe")
        built.host_behind(built.router("home3"), "nat3")
        for name in ("t1", "t2", "t3", "rl-trainer", "rl-validator", "rl-worker"):
            built.public_host(name)
        built.host_behind(built.router("home4"), "rl-natted")
        yield built


@pytest.fixture(scope="module")
def swarm(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(run_id="netns", workdir=tmp_path_factory.mktemp("netns-swarm")) as started:
        started.start_seed(placement=lab.hosts["seed"].placement, extra_args=LAB_NETWORK)
        for name in ("pub", "nat1", "nat2"):
            started.add_node(name=name, placement=lab.hosts[name].placement, extra_args=LAB_NETWORK)
        started.wait_converged()
        yield started


def _logged(node: SwarmNode, text: str) -> bool:
    return text in node.log_file.read_text(errors="replace")


def test_nodes_behind_different_nats_join_and_see_the_whole_swarm(swarm: LocalSwarm) -> None:
    everyone = {node.peer_id for node in swarm.running_nodes()} | {swarm.seed.peer_id}  # type: ignore[union-attr]
    for node in swarm.running_nodes():
        status = node.status()
        assert status is not None and set(status.live_nodes) == everyone, node.log_tail()


def test_join_says_whether_peers_can_dial_the_node_and_what_a_natted_one_can_do(swarm: LocalSwarm) -> None:
    public, natted = swarm.nodes["pub"], swarm.nodes["nat1"]
    assert wait_until(lambda: _logged(public, "reachable: "), timeout_s=120), public.log_tail()
    assert wait_until(lambda: _logged(natted, "not reachable from outside"), timeout_s=120), natted.log_tail()
    assert not _logged(public, "not reachable"), public.log_tail()
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
    lab: Lab, swarm: LocalSwarm, tmp_path: Path
) -> None:
    natted = _doctor(lab.hosts["nat3"], swarm.seed_multiaddr, tmp_path)
    assert natted["dial-back"]["ok"] is False, natted
    assert "--auto-relay" in str(natted["dial-back"]["fix"]), natted
    public = _doctor(lab.hosts["probe"], swarm.seed_multiaddr, tmp_path)
    assert public["dial-back"]["ok"] is True, public


def _steps(node: SwarmNode) -> dict[int, tuple[int, str, bool]]:
    """Per outer step a trainer printed: (peers averaged with, state hash, whether it resynced)."""
    steps = {}
    for match in STEP.finditer(node.log_file.read_text(errors="replace")):
        steps[int(match[1])] = (int(match[2]), match[3], "resynced" in match[4])
    return steps


@pytest.mark.timeout(900)
def test_a_trainer_whose_link_is_cut_mid_run_is_left_out_then_comes_back(lab: Lab, swarm: LocalSwarm) -> None:
    """Three trainers on three hosts; the third one's cable is pulled once it has finished its first
    outer step, and plugged back once the other two have finished the third. The round in flight at
    the cut may still include it (its contribution may have left before); the third round began after
    the cut, so the other two average it without it. The cut node notices that it lost the swarm and,
    once the cable is back, dials its seed again instead of training alone for good."""
    outer_steps = 6
    args = [*TINY_TRAINER, "--outer-steps", str(outer_steps), "--wait-for-trainers", "3", *LAB_NETWORK]
    names = ["t1", "t2", "t3"]
    for name in names:
        swarm.add_node(
            name=name, roles=["trainer"], wait=False, placement=lab.hosts[name].placement, extra_args=args
        )
    t1, t2, t3 = (swarm.nodes[name] for name in names)

    def report() -> str:
        return "\n\n".join(f"--- {n.name}\n{n.log_tail(40)}" for n in (t1, t2, t3))

    assert wait_until(lambda: 1 in _steps(t3), timeout_s=300), report()
    lab.cut(lab.hosts["t3"])
    try:
        assert wait_until(lambda: all(3 in _steps(n) for n in (t1, t2)), timeout_s=420), report()
        assert wait_until(lambda: _logged(t3, "lost every DHT peer"), timeout_s=120), report()
    finally:
        lab.restore(lab.hosts["t3"])
    assert wait_until(lambda: _logged(t3, "back in the swarm"), timeout_s=120), report()
    assert wait_until(lambda: not any(n.alive for n in (t1, t2, t3)), timeout_s=600), report()
    steps = [_steps(n) for n in (t1, t2, t3)]
    assert all(sorted(s) == list(range(1, outer_steps + 1)) for s in steps), report()
    # the round that began after the cut went on without t3, the other two in one state
    assert steps[0][3][0] == steps[1][3][0] == 2 and steps[0][3][1] == steps[1][3][1], report()
    assert steps[0][outer_steps][1] == steps[1][outer_steps][1], report()
    if steps[2][outer_steps][1] != steps[0][outer_steps][1]:
        pytest.xfail(
            "known gap (docs/ARCHITECTURE.md, Real networks): while cut off, a trainer takes outer steps "
            "alone and ends ahead of the run, and a trainer ahead is never made to resync"
        )


def test_the_weight_broadcast_reaches_hosts_behind_nat(lab: Lab, tmp_path: Path) -> None:
    """A version published on a public host is fetched, verified and identical, on two hosts behind
    two different NATs, which can dial out but cannot be dialled."""
    import torch
    from safetensors.torch import load_file, save_file

    from node.identity import create_identity

    weights_file = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(300, 400), "b": torch.arange(9)}, str(weights_file))
    publisher_id = create_identity(tmp_path / "pub.key").peer_id.to_base58()
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
    lab: Lab, tmp_path: Path
) -> None:
    """An RL run on public hosts (trainer, validator, one inference worker) and one inference worker
    behind a NAT: the NATed worker fetches the policy, submits rollouts, and has groups accepted on
    a policy version past the first, i.e. after the trainer trained on accepted rollouts."""
    from node.identity import create_identity

    trainer_id = create_identity(tmp_path / "trainer.key").peer_id.to_base58()
    validator_id = create_identity(tmp_path / "validator.key").peer_id.to_base58()
    common = ["--rl", "--trusted-validator", validator_id, *LAB_NETWORK]
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
        assert _logged(natted, "not reachable from outside"), report()
