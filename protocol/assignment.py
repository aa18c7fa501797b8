"""Rollout assignments: which prompt and which sampling seeds a worker must use, derived, never chosen.

A worker's assignment is a pure function of the run id, the policy version, the worker's PeerID,
a counter and a nonce, the last three from a ticket the validator issued (`Ticket` in
`protocol/rollouts.proto`). The validator picks the counter and the policy version (its newest)
and draws the nonce at random, so the worker learns the prompt and the seeds only once both are
fixed: it cannot generate a counter under several versions and submit the best, nor generate
ahead and ask for a ticket that suits the outcome. Each ticket is judged once (a second group for
it is a replay), and tickets a worker let expire are counted as abandoned assignments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Assignment", "derive_assignment"]

_DOMAIN = b"hivenet-assignment-v2\x00"


@dataclass(frozen=True)
class Assignment:
    """The worker's assignment of one ticket: one prompt (by seed) and one sampling seed per completion."""

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
    run_id: str, policy_version: int, worker: bytes, counter: int, group_size: int, *, nonce: bytes
) -> Assignment:
    """The assignment of the ticket (`counter`, `policy_version`, `nonce`) issued to `worker` (PeerID bytes)."""
    if counter < 0 or policy_version < 0:
        raise ValueError("counter and policy_version must be >= 0")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    base = (
        run_id.encode(),
        str(policy_version).encode(),
        worker,
        str(counter).encode(),
        nonce.hex().encode(),
    )
    return Assignment(
        run_id=run_id,
        policy_version=policy_version,
        worker=worker,
        counter=counter,
        prompt_seed=_u64(*base, b"prompt"),
        sampling_seeds=tuple(_u64(*base, b"sample", str(i).encode()) for i in range(group_size)),
    )
