"""Assignments are fixed by (run, version, worker, counter, ticket nonce) and differ when any of them does."""

from __future__ import annotations

import pytest

from protocol.assignment import derive_assignment

WORKER = b"\x00\x24" + bytes(36)
NONCE = bytes(range(16))


def test_the_same_inputs_give_the_same_assignment() -> None:
    assert derive_assignment("run", 3, WORKER, 7, 4, nonce=NONCE) == derive_assignment(
        "run", 3, WORKER, 7, 4, nonce=NONCE
    )


@pytest.mark.parametrize(
    "other",
    [
        ("run2", 3, WORKER, 7, NONCE),
        ("run", 4, WORKER, 7, NONCE),
        ("run", 3, WORKER[:-1] + b"\x01", 7, NONCE),
        ("run", 3, WORKER, 8, NONCE),
        ("run", 3, WORKER, 7, NONCE[:-1] + b"\xff"),
    ],
)
def test_any_change_of_input_changes_prompt_and_seeds(other: tuple[str, int, bytes, int, bytes]) -> None:
    mine = derive_assignment("run", 3, WORKER, 7, 4, nonce=NONCE)
    run_id, version, worker, counter, nonce = other
    theirs = derive_assignment(run_id, version, worker, counter, 4, nonce=nonce)
    assert mine.prompt_seed != theirs.prompt_seed
    assert not set(mine.sampling_seeds) & set(theirs.sampling_seeds)


def test_each_completion_has_its_own_seed() -> None:
    seeds = derive_assignment("run", 0, WORKER, 0, 16, nonce=NONCE).sampling_seeds
    assert len(set(seeds)) == 16


@pytest.mark.parametrize("kwargs", [{"counter": -1}, {"policy_version": -1}, {"group_size": 0}])
def test_bad_arguments_are_refused(kwargs: dict[str, int]) -> None:
    args = {"run_id": "run", "policy_version": 0, "worker": WORKER, "counter": 0, "group_size": 2} | kwargs
    with pytest.raises(ValueError):
        derive_assignment(**args, nonce=NONCE)  # type: ignore[arg-type]
