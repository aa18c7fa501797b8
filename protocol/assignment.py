"""Rollout assignments: which prompt and which sampling seeds a worker must use, derived, never chosen.

A worker's `counter`-th assignment in a run is a pure function of the run id, the policy version
it generates with, the worker's PeerID and the counter. Nobody hands it out, so nothing can be
withheld or forged; any validator re-derives it from the group it receives and rejects a group
whose prompt or seeds differ. A worker cannot pick favourable prompts or seeds: every counter is
used once (a second group with the same counter is a replay), and counters a worker skipped are
visible to a validator as abandoned assignments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Assignment", "derive_assignment"]

_DOMAIN = b"hivenet-assignment-v1\x00"


@dataclass(frozen=True)
class Assignment:
    """The worker's `counter`-th assignment: one prompt (by seed) and one sampling seed per completion."""

    run_id: str
    policy_version: int
    worker: bytes
    counter: int
    prompt_seed: int
    """Seed from which the run's task builds the prompt (`Task.prompt(prompt_seed)`)."""
    sampling_seeds: tuple[int, ...]
    """Sampling seed of each of the group's completions, in order."""


def _u64(*parts: bytes) -> int:
    digest = hashlib.sha256(_DOMAIN + b"\x00".join(parts)).digest()
    return int.from_bytes(digest[:8], "big")


def derive_assignment(
    run_id: str, policy_version: int, worker: bytes, counter: int, group_size: int
) -> Assignment:
    """The assignment number `counter` of `worker` (PeerID bytes) on `policy_version` of `run_id`."""
    if counter < 0 or policy_version < 0:
        raise ValueError("counter and policy_version must be >= 0")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    base = (run_id.encode(), str(policy_version).encode(), worker, str(counter).encode())
    return Assignment(
        run_id=run_id,
        policy_version=policy_version,
        worker=worker,
        counter=counter,
        prompt_seed=_u64(*base, b"prompt"),
        sampling_seeds=tuple(_u64(*base, b"sample", str(i).encode()) for i in range(group_size)),
    )
