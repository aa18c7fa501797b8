"""Fixtures of the RL validator tests: the task, policy weights per version, two workers, honest
groups generated once per session (read-only, handed out as copies), a clock and a validator
factory (its tickets' nonces are zeros, so that groups can be generated ahead of them)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from protocol import rollouts_pb2
from tests.helpers.rl_workers import FakeTask, RLWorker, zero_nonces
from tests.helpers.validator_setup import (
    ALICE,
    ASYNC,
    BOB,
    GROUP,
    RUN,
    VALIDATOR_KEY,
    AutoTicketValidator,
    FakeClock,
)
from training.model import ModelConfig, TinyGPT
from verification.tickets import TicketBook
from verification.validator import Validator


@pytest.fixture(scope="session")
def task() -> FakeTask:
    return FakeTask()


@pytest.fixture(scope="session")
def policies() -> dict[int, TinyGPT]:
    """Policy weights per version (each version its own random weights)."""
    out = {}
    for v in range(6):
        torch.manual_seed(v)
        out[v] = TinyGPT(ModelConfig()).eval()
    return out


@pytest.fixture(scope="session")
def alice(task: FakeTask) -> RLWorker:
    return RLWorker(ALICE, run_id=RUN, task=task, group_size=GROUP)


@pytest.fixture(scope="session")
def bob(task: FakeTask) -> RLWorker:
    return RLWorker(BOB, run_id=RUN, task=task, group_size=GROUP)


@pytest.fixture(scope="session")
def honest(alice: RLWorker, policies: dict[int, TinyGPT]) -> Callable[[int, int], rollouts_pb2.RolloutGroup]:
    """Alice's honest group for (version, counter), generated once per session and copied."""
    cache: dict[tuple[int, int], bytes] = {}

    def build(version: int, counter: int) -> rollouts_pb2.RolloutGroup:
        if (version, counter) not in cache:
            cache[(version, counter)] = alice.group(policies[version], version, counter).SerializeToString()
        return rollouts_pb2.RolloutGroup.FromString(cache[(version, counter)])

    return build


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_validator(
    task: FakeTask, policies: dict[int, TinyGPT], clock: FakeClock
) -> Callable[..., Validator]:
    def make(versions: tuple[int, ...] = (0,), **kwargs: object) -> Validator:
        """A validator holding `versions` that issues each group's ticket as it arrives
        (`AutoTicketValidator`; `tickets_on_request=True`: a plain `Validator`, tickets only on request)."""
        kwargs.setdefault("task", task)
        kwargs.setdefault("private_key", VALIDATOR_KEY)
        kwargs.setdefault("tickets", TicketBook(run_id=RUN, nonces=zero_nonces))
        kind = Validator if kwargs.pop("tickets_on_request", False) else AutoTicketValidator
        v = kind(
            run_id=RUN,
            group_size=GROUP,
            async_level=ASYNC,
            clock=clock,
            **kwargs,  # type: ignore[arg-type]
        )
        for version in versions:
            v.add_version(version, policies[version])
        return v

    return make
