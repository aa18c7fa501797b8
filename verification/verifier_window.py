"""The policy versions a validator can verify: the newest `async_level + 1`, one verifier each.

A worker may generate with a policy up to `async_level` steps behind the trainer. The window
keeps a `RolloutVerifier` (its own copy of the weights) for each of the newest
`async_level + 1` versions, remembers which older versions it has dropped, and classifies the
version a group claims: held (verifiable), stale (older than the trainer's step allows, already
dropped, or older than every version held), or unknown (not held yet: maybe newer than what this
validator holds, or one between its held versions that it has yet to add).

It also remembers the hashes of rollouts judged for each held version, so a rollout submitted
twice is a replay; those are forgotten with their version (a rollout is bound to its version by
its assigned seeds, and rollouts of dropped versions are stale anyway). With a `ReplayMemory`
(`verification.replay_memory`) they outlive the process: a version added again after a restart
takes back the hashes remembered for it, and versions too old to judge are forgotten there too.

An inference worker's window (`training.rl_run.ModelWindow`) keeps models to generate with; it
shares only "drop the oldest beyond the window" with this one, which adds weight snapshots,
memory of dropped versions, staleness against the trainer's step and replay hashes.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass

from protocol.verification_policy import RunVerification
from training.causal_lm import CausalLM
from verification.replay_memory import ReplayMemory
from verification.verdict import RolloutVerifier

__all__ = ["VerifierWindow", "VersionStatus", "VersionVerdict"]


class VersionStatus(enum.Enum):
    HELD = "held"
    STALE = "stale"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class VersionVerdict:
    """How a claimed version stands; `verifier` is set when it is held and not stale."""

    status: VersionStatus
    detail: str = ""
    verifier: RolloutVerifier | None = None


class VerifierWindow:
    """The newest `async_level + 1` policy versions, a verifier each, and the trainer's step (not thread-safe:
    the validator holds its lock)."""

    def __init__(
        self,
        async_level: int,
        verification: RunVerification | None = None,
        memory: ReplayMemory | None = None,
    ) -> None:
        if async_level < 0:
            raise ValueError(f"async_level must be >= 0, got {async_level}")
        self.async_level = async_level
        self.verification = verification
        """The run's limits (None: the built-in ones of the model's backend)."""
        self.memory = memory
        """Where the replay hashes outlive the process (None: in memory only)."""
        self.trainer_step: int | None = None
        self._verifiers: dict[int, RolloutVerifier] = {}
        self._dropped: set[int] = set()
        self._hashes: dict[int, set[bytes]] = {}

    @property
    def held(self) -> list[int]:
        """Versions held, oldest first."""
        return sorted(self._verifiers)

    def add(self, version: int, model: CausalLM) -> list[int]:
        """Hold `version` (a private copy of `model`); returns the versions dropped to make room."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        if version in self._verifiers or version in self._dropped:
            raise ValueError(f"policy version {version} was already added")
        # A copy: the caller (a trainer) keeps training its model, the verdict needs these weights.
        snapshot = copy.deepcopy(model).eval()
        self._verifiers[version] = RolloutVerifier(snapshot, version, self.verification)
        self._hashes[version] = set() if self.memory is None else self.memory.recall(version)
        dropped = self.held[: -(self.async_level + 1)]
        for old in dropped:
            del self._verifiers[old]
            del self._hashes[old]
            self._dropped.add(old)
        reference = self.reference_step()
        if self.memory is not None and reference is not None:
            self.memory.forget_before(reference - self.async_level)  # stale for good
        return dropped

    def reference_step(self) -> int | None:
        """What staleness is measured against: the trainer's step or the newest held version."""
        candidates = [s for s in (self.trainer_step, max(self._verifiers, default=None)) if s is not None]
        return max(candidates, default=None)

    def classify(self, version: int) -> VersionVerdict:
        """Whether a group generated with `version` can be verified now."""
        reference = self.reference_step()
        if reference is not None and version < reference - self.async_level:
            return VersionVerdict(
                VersionStatus.STALE,
                f"policy version {version} is more than {self.async_level} behind step {reference}",
            )
        verifier = self._verifiers.get(version)
        if verifier is not None:
            return VersionVerdict(VersionStatus.HELD, verifier=verifier)
        if version in self._dropped or (self._verifiers and version < min(self._verifiers)):
            # dropped, or older than any held (a restarted validator holds what it resumed at and newer)
            return VersionVerdict(
                VersionStatus.STALE,
                f"policy version {version} is older than the versions this validator keeps",
            )
        return VersionVerdict(
            VersionStatus.UNKNOWN,
            f"policy version {version} is not held (holding {self.held or 'none'})",
        )

    def seen_hash(self, rollout_hash: bytes) -> bool:
        """Whether a rollout with this hash was judged for any held version."""
        return any(rollout_hash in hashes for hashes in self._hashes.values())

    def remember_hashes(self, version: int, hashes: list[bytes]) -> None:
        """Record judged rollouts of a held `version` (no-op for a version not held)."""
        if version in self._hashes:
            self._hashes[version].update(hashes)
            if self.memory is not None:
                self.memory.remember(version, hashes)
