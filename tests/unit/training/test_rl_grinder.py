"""The benchmark's grinder cheats the way a real one would: best version first, then it learns.

Its generation and scoring are replaced by fakes here (a group's reward is fixed by its version);
what is tested is its choices, which decide what `bench/rl.py` can measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.rollout_messages import WRONG_VERSION
from protocol.rollouts_pb2 import Ticket
from training.rl_grinder import Grinder
from training.worker_groups import GeneratedGroup

REWARD_BY_VERSION = {3: [0.0, 0.5], 4: [1.0, 1.0]}
"""Version 4 scores best; the tickets fix version 3."""


@dataclass
class _Window:
    def versions(self) -> list[int]:
        return sorted(REWARD_BY_VERSION)

    def get(self, version: int) -> object:
        return f"model-v{version}"


@dataclass
class _Worker:
    window: _Window = field(default_factory=_Window)
    receipts: list[Any] = field(default_factory=list)
    generated: list[tuple[int, int]] = field(default_factory=list)

    def generate(self, ticket: Ticket, model: object) -> GeneratedGroup:
        self.generated.append((int(ticket.counter), int(ticket.policy_version)))
        return _group(int(ticket.counter), int(ticket.policy_version))


def _group(counter: int, version: int) -> GeneratedGroup:
    return GeneratedGroup(counter, version, tokens=8, seconds=0.0, sealed=b"")


@pytest.fixture
def grinder(monkeypatch: pytest.MonkeyPatch) -> Grinder:
    made = Grinder(_Worker())  # type: ignore[arg-type]
    monkeypatch.setattr(made, "_rewards", lambda group: list(REWARD_BY_VERSION[group.version]))
    return made


def _ticket(counter: int) -> Ticket:
    return Ticket(counter=counter, policy_version=3, nonce=b"n" * 16)


def test_the_grinder_submits_the_best_version_and_records_the_honest_rewards(grinder: Grinder) -> None:
    chosen = grinder.choose(_ticket(0), _group(0, 3))
    assert chosen is not None and chosen.version == 4
    (record,) = grinder.records
    assert record.honest_rewards == (0.0, 0.5) and record.submitted_version == 4


def test_once_refused_as_wrong_version_it_submits_only_the_tickets_version(grinder: Grinder) -> None:
    worker: Any = grinder.worker
    worker.receipts.append(SimpleNamespace(verdict=SimpleNamespace(reason=WRONG_VERSION)))
    chosen = grinder.choose(_ticket(1), _group(1, 3))
    assert chosen is not None and chosen.version == 3
    assert worker.generated == []  # it no longer generates the ticket under other versions


def test_a_dropped_ticket_is_not_generated_again_when_it_comes_back(grinder: Grinder) -> None:
    worker: Any = grinder.worker
    worker.receipts.append(SimpleNamespace(verdict=SimpleNamespace(reason=WRONG_VERSION)))
    grinder._submitted_rewards = [0.9] * 4  # its median so far is above what version 3 scores
    assert grinder.choose(_ticket(2), _group(2, 3)) is None
    assert grinder.choose(_ticket(2), _group(2, 3)) is None  # the validator handed the open ticket back
    assert [r.counter for r in grinder.records] == [2]
