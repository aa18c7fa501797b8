"""The grinding cheat, for the RL benchmark and tests: choose among several generations of one ticket.

Before tickets, a worker could generate one assignment counter under every policy version a
validator still accepted and submit the best group, and drop a group that scored badly and
generate its counter again on an older version. A `Grinder` tries exactly that on a ticketed
run: for each ticket it also generates the ticket's counter and nonce under every other version
it holds, submits the group that scores best by the task's own reward (labelled with the version
that made it), and drops its choice when it scores below the median of what it submitted before
(asking for another ticket instead). It learns as a real cheat would: once a validator refused
one of its groups as `wrong_version` it submits only the ticket's version, and a ticket it
dropped stays dropped when the validator hands it back (it is not generated again). It records, per ticket, the mean reward of the group an
honest worker would have submitted (the ticket's version), so a benchmark can compare what the
grinder got accepted with what the same tickets (rollout by rollout) would have earned honestly.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.rollout_messages import WRONG_VERSION, open_group, parse_rollout
from protocol.rollouts_pb2 import Ticket
from training.worker_groups import GeneratedGroup

if TYPE_CHECKING:
    from training.rl_worker import InferenceWorker

__all__ = ["GrindRecord", "Grinder"]

_MEDIAN_AFTER = 4
"""Groups submitted before the grinder starts dropping the ones below their median."""


@dataclass(frozen=True)
class GrindRecord:
    """One ticket the grinder worked on."""

    counter: int
    ticket_version: int
    honest_rewards: tuple[float, ...]
    """The reward of each rollout of the ticket version's group, in order: what an honest worker would
    have submitted for this ticket."""
    submitted_version: int | None
    """The version of the group it submitted (None: it dropped the ticket)."""


class Grinder:
    """Picks, for an `InferenceWorker` with `cheat=CheatMode.GRINDER`, which generation of a ticket to submit."""

    def __init__(self, worker: InferenceWorker) -> None:
        self.worker = worker
        self.records: list[GrindRecord] = []
        self._submitted_rewards: list[float] = []
        self._dropped: set[int] = set()

    def _versions_refused(self) -> bool:
        return any(receipt.verdict.reason == WRONG_VERSION for receipt in self.worker.receipts)

    def choose(self, ticket: Ticket, honest: GeneratedGroup) -> GeneratedGroup | None:
        """The group to submit for `ticket` (None: drop it), given the honest group generated for it."""
        if int(ticket.counter) in self._dropped:
            return None
        candidates = {int(ticket.policy_version): honest}
        for version in [] if self._versions_refused() else self.worker.window.versions():
            model = self.worker.window.get(version)
            if version in candidates or model is None:
                continue
            other = Ticket(counter=ticket.counter, policy_version=version, nonce=ticket.nonce)
            candidates[version] = self.worker.generate(other, model)
        per_rollout = {version: self._rewards(group) for version, group in candidates.items()}
        rewards = {version: statistics.fmean(values) for version, values in per_rollout.items()}
        best = max(rewards, key=lambda version: rewards[version])
        drop = len(self._submitted_rewards) >= _MEDIAN_AFTER and rewards[best] < statistics.median(
            self._submitted_rewards
        )
        self.records.append(
            GrindRecord(
                counter=int(ticket.counter),
                ticket_version=int(ticket.policy_version),
                honest_rewards=tuple(per_rollout[int(ticket.policy_version)]),
                submitted_version=None if drop else best,
            )
        )
        if drop:
            self._dropped.add(int(ticket.counter))
            return None
        self._submitted_rewards.append(rewards[best])
        return candidates[best]

    def _rewards(self, generated: GeneratedGroup) -> list[float]:
        _, group = open_group(generated.sealed, run_id=self.worker.config.run_id)
        rewards = []
        for data in group.rollouts:
            rollout = parse_rollout(data)
            rewards.append(self.worker.task.reward(list(rollout.prompt_ids), list(rollout.completion_ids)))
        return rewards
