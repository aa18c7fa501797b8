"""The reducer audit: every part of a round is reduced twice, by two different members, and compared.

A reducer that sends every member the same wrong average of its part would pass every other
check: the members all hold the same corrupted state, so the next round's hash check agrees.
The audit makes that lie visible:

* After the round's all-reduce, the group runs a second all-reduce of the same inputs under a
  group id derived from the round's (`audit_group_id`), with the group's order rotated by one
  (`rotated`). Parts are cut the same way whatever the order (hivemind splits each tensor into
  fixed-size parts, then hands them out in order), so each part is reduced by the next member
  in the group the second time.
* Every reducer stacks its inputs in PeerID order (`node.averaging.runner`) and the rule is
  deterministic, so two honest reducers of the same inputs return the same bits. Each member
  compares the two averages part by part (`compare`): a part whose two averages differ is
  *disputed* and contributes no update this round (zeros); every other part is kept.
* A lying reducer of either pass therefore corrupts nothing: its parts come out as zeros, on
  every member alike when it lied to everyone, so the members stay bit-identical. A reducer
  that lies to some members only still shows up in the next round's hash check.

Who lied is not decided here: a disputed part names a pair of reducers, one of them honest, and
an honest pair can disagree too when one of them refused a sender that the other accepted (each
bounds a part's norm by its own scale). Two colluding liars placed around an honest member could
also make it look like the one reducer common to all disputes. The pairs are reported (logged
and counted) rather than banned on; what a liar gains is a lost update for the parts it touched.

It costs a second all-reduce per round (twice the bytes and the reducers' work). Only the robust
rules are audited: hivemind's running-sum mean depends on arrival order, so two honest reducers
of it differ in the last bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from hivemind.p2p import PeerID

__all__ = ["AuditResult", "audit_group_id", "compare", "rotated"]

_AUDIT_TAG = b"hivenet-reducer-audit"


def audit_group_id(group_id: bytes) -> bytes:
    """The group id of a round's audit pass (as long as the round's, so hivemind treats it alike)."""
    return hashlib.sha256(_AUDIT_TAG + group_id).digest()[: len(group_id)]


def rotated(
    peer_ids: Sequence[PeerID], fractions: Sequence[float]
) -> tuple[tuple[PeerID, ...], tuple[float, ...]]:
    """The group order of the audit pass: every member moved one place forward, with its fraction."""
    return (*peer_ids[1:], *peer_ids[:1]), (*fractions[1:], *fractions[:1])


@dataclass
class AuditResult:
    """What comparing a round's two passes found."""

    averaged: list[torch.Tensor]
    """The round's result: each part as both passes agree on it, zeros where they disagree."""
    disputed_parts: int = 0
    disputed_values: int = 0
    disputed_pairs: list[tuple[PeerID, PeerID]] = field(default_factory=list)
    """For each disputed part, its reducer in the first pass and in the audit pass."""


def compare(
    first: Sequence[torch.Tensor],
    second: Sequence[torch.Tensor],
    first_reducers: Sequence[tuple[PeerID, int]],
    second_reducers: Sequence[tuple[PeerID, int]],
) -> AuditResult:
    """Compare the two passes' averages part by part (`*_reducers`: each part's reducer and length).

    Raises ValueError if the passes cut the vector differently (then they cannot be compared).
    """
    if [n for _, n in first_reducers] != [n for _, n in second_reducers]:
        raise ValueError("the two passes cut the vector into different parts")
    flat_first = torch.cat([t.reshape(-1) for t in first]) if first else torch.zeros(0)
    flat_second = torch.cat([t.reshape(-1) for t in second]) if second else torch.zeros(0)
    if flat_first.numel() != sum(n for _, n in first_reducers) or flat_second.shape != flat_first.shape:
        raise ValueError("the averages do not match the parts they were cut into")
    merged = flat_first.clone()
    result = AuditResult(averaged=[])
    start = 0
    for (reducer, length), (auditor, _) in zip(first_reducers, second_reducers, strict=True):
        end = start + length
        if not torch.equal(flat_first[start:end], flat_second[start:end]):
            merged[start:end] = 0.0
            result.disputed_parts += 1
            result.disputed_values += length
            result.disputed_pairs.append((reducer, auditor))
        start = end
    result.averaged = [
        part.view_as(t) for part, t in zip(merged.split([t.numel() for t in first]), first, strict=True)
    ]
    return result
