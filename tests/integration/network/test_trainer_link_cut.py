"""A trainer whose link is cut mid-run and restored, each trainer on a host of its own
(`tests.helpers.netns`; the network stage, `scripts/test.sh network`)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from node.swarm import LocalSwarm, SwarmNode, wait_until
from tests.helpers.netns import Lab, logged
from tests.integration.network.conftest import LAB_NETWORK

pytestmark = pytest.mark.slow

TINY_TRAINER = ["--inner-steps", "5", "--seq-len", "32", "--batch-size", "4", "--wait-for-trainers", "3"]
STEP = re.compile(r"outer step +(\d+) \|.*\| peers (\d+) \|.*\| state (\w+)(.*)")


@pytest.fixture(scope="module")
def seeded(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    for name in ("seed", "t1", "t2", "t3"):
        lab.public_host(name)
    with LocalSwarm(run_id="netns-cut", workdir=tmp_path_factory.mktemp("netns-cut")) as swarm:
        swarm.start_seed(placement=lab.hosts["seed"].placement, extra_args=LAB_NETWORK)
        yield swarm


def _steps(node: SwarmNode) -> dict[int, tuple[int, str, bool]]:
    """Per outer step a trainer printed: (peers averaged with, state hash, whether it resynced)."""
    steps = {}
    for match in STEP.finditer(node.log_file.read_text(errors="replace")):
        steps[int(match[1])] = (int(match[2]), match[3], "resynced" in match[4])
    return steps


@pytest.mark.timeout(900)
def test_a_trainer_whose_link_is_cut_mid_run_is_left_out_then_comes_back(
    lab: Lab, seeded: LocalSwarm
) -> None:
    """Three trainers on three hosts; the third one's cable is pulled once it has finished its first
    outer step, and plugged back once the other two have finished the third. The round in flight at
    the cut may still include it (its contribution may have left before); the third round began after
    the cut, so the other two average it without it. The cut node notices that it lost the swarm and,
    once the cable is back, dials its seed again instead of training alone for good.

    The third trainer has no step budget of its own (it is stopped once back): cut off, it takes
    outer steps alone (the known gap below), and with the others' budget it could finish before
    the cable is back."""
    outer_steps = 6
    for name, budget in (("t1", outer_steps), ("t2", outer_steps), ("t3", 10_000)):
        seeded.add_node(
            name=name, roles=["trainer"], wait=False, placement=lab.hosts[name].placement,
            extra_args=[*TINY_TRAINER, "--outer-steps", str(budget), *LAB_NETWORK],
        )  # fmt: skip
    t1, t2, t3 = (seeded.nodes[name] for name in ("t1", "t2", "t3"))

    def report() -> str:
        return "\n\n".join(f"--- {n.name}\n{n.log_tail(40)}" for n in (t1, t2, t3))

    assert wait_until(lambda: 1 in _steps(t3), timeout_s=300), report()
    lab.cut(lab.hosts["t3"])
    try:
        assert wait_until(lambda: all(3 in _steps(n) for n in (t1, t2)), timeout_s=420), report()
        assert wait_until(lambda: logged(t3, "lost every DHT peer"), timeout_s=120), report()
    finally:
        lab.restore(lab.hosts["t3"])
    restored_at = max(_steps(t3))
    assert wait_until(lambda: logged(t3, "back in the swarm"), timeout_s=120), report()
    assert wait_until(lambda: not (t1.alive or t2.alive), timeout_s=600), report()
    seeded.stop_node("t3")
    steps = [_steps(n) for n in (t1, t2)]
    assert all(sorted(s) == list(range(1, outer_steps + 1)) for s in steps), report()
    # the round that began after the cut went on without t3, the other two in one state
    assert steps[0][3][0] == steps[1][3][0] == 2 and steps[0][3][1] == steps[1][3][1], report()
    assert steps[0][outer_steps][1] == steps[1][outer_steps][1], report()
    if not any(resynced for step, (_, _, resynced) in _steps(t3).items() if step > restored_at):
        pytest.xfail(
            "known gap (docs/ARCHITECTURE.md, Real networks): while cut off, a trainer takes outer steps "
            "alone and comes back ahead of the run, and a trainer ahead is never made to resync"
        )
