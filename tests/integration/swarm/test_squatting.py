"""Squatting the run's DHT keys from a plain hivemind client does not break the run (issue 12).

On 127.0.0.1, two honest nodes (the production record validator and DHT guard) and, per test, a
fresh attacker without a validator: it stores `b"squatted"` with a 31-year expiry under one key,
as a plain value, under an honest peer's subkey and as a 1 MiB value (`tests.helpers.squatting`,
which `bench/robustness.py` runs too). No honest node may keep or return any of them, and what the
squat used to break must still work afterwards. Finally, 64 stores of 1 MiB values at one node are
all refused and its DHT process does not grow by what was sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.squat_swarm import (
    LARGE_VALUE_BYTES,
    LARGE_VALUES,
    SquatOutcome,
    SquatSwarm,
    open_squat_swarm,
)
from tests.helpers.squatting import (
    attack_with_large_values,
    run_squat_attack,
)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Iterator[SquatSwarm]:
    with open_squat_swarm(tmp_path_factory.mktemp("squat")) as swarm:
        yield swarm


def _check(outcome: SquatOutcome) -> None:
    print(f"{outcome.attack}: {outcome.squats_kept} squat(s) kept; {outcome.detail}")
    assert outcome.squats_kept == 0, f"honest nodes kept or returned {outcome.squats_kept} squatted value(s)"
    assert outcome.honest_ok, outcome.detail


def test_a_squatted_weights_pointer_neither_hides_nor_blocks_the_publisher(swarm: SquatSwarm) -> None:
    """Pointer still found, the publisher's next `latest` stored, the next version fetched."""
    _check(run_squat_attack(swarm, "weights pointer"))


def test_a_squatted_holders_key_does_not_hide_the_holders(swarm: SquatSwarm) -> None:
    """The publisher is still seen as a holder, and the version is fetched from it."""
    _check(run_squat_attack(swarm, "weights holders"))


def test_a_squatted_node_records_key_does_not_hide_the_nodes(swarm: SquatSwarm) -> None:
    """Discovery still finds both nodes from either side, and both re-publish their records."""
    _check(run_squat_attack(swarm, "node records"))


def test_a_squatted_round_declarations_key_does_not_make_trainers_average_alone(swarm: SquatSwarm) -> None:
    """Both averagers still see each other's declarations and average together at the squatted key."""
    _check(run_squat_attack(swarm, "round declarations"))


def test_declarations_forged_in_a_trainers_name_are_refused(swarm: SquatSwarm) -> None:
    """An unsigned declaration of a step the victim never reached, in its subkey: its peer still sees
    its real step, and the two still average together."""
    _check(run_squat_attack(swarm, "forged declarations"))


def test_large_values_are_refused_and_not_buffered(swarm: SquatSwarm) -> None:
    outcome = attack_with_large_values(swarm)
    sent = LARGE_VALUES * LARGE_VALUE_BYTES
    print(f"large values: {outcome.accepted} accepted, DHT process grew by {outcome.growth / 2**20:.1f} MiB")
    assert outcome.accepted == 0
    assert outcome.growth < sent // 4, f"the DHT process grew by {outcome.growth / 2**20:.0f} MiB"
