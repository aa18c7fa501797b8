"""The reducer audit's pieces without a network: comparing two passes, the rotated order, and a
reducer whose result does not depend on the order its senders are numbered in."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hivemind.p2p import PeerID

from node.averaging.audit import audit_group_id, compare, rotated
from node.averaging.runner import RobustPartReducer

A, B, C = (PeerID(bytes([0, 36, 8, 1, 18, 32]) + bytes([i]) * 32) for i in (1, 2, 3))


def test_two_equal_passes_give_the_first_and_no_dispute() -> None:
    first = [torch.arange(6.0).view(2, 3), torch.arange(4.0)]
    second = [t.clone() for t in first]
    result = compare(first, second, [(A, 4), (B, 6)], [(B, 4), (C, 6)])
    assert result.disputed_parts == 0 and result.disputed_pairs == []
    assert all(torch.equal(r, t) for r, t in zip(result.averaged, first, strict=True))
    assert [r.shape for r in result.averaged] == [torch.Size([2, 3]), torch.Size([4])]


def test_a_part_whose_passes_differ_is_left_at_zero_and_names_its_two_reducers() -> None:
    first = [torch.ones(6), torch.full((4,), 2.0)]
    second = [torch.ones(6), torch.full((4,), 2.0)]
    second[0][5] += 1e-7  # one value of the first tensor's second part (values 4..9)
    result = compare(first, second, [(A, 4), (B, 6)], [(B, 4), (C, 6)])
    assert result.disputed_parts == 1 and result.disputed_values == 6
    assert result.disputed_pairs == [(B, C)]
    assert torch.equal(result.averaged[0], torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]))
    assert torch.equal(result.averaged[1], torch.zeros(4))
    assert torch.equal(first[0], torch.ones(6)), "the passes' own tensors are left as they were"


def test_passes_cut_differently_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="different parts"):
        compare([torch.ones(4)], [torch.ones(4)], [(A, 4)], [(A, 2), (B, 2)])
    with pytest.raises(ValueError, match="do not match"):
        compare([torch.ones(4)], [torch.ones(4)], [(A, 3)], [(B, 3)])


def test_the_audit_pass_moves_every_member_one_place_and_has_its_own_group_id() -> None:
    assert rotated([A, B, C], [1.0, 0.0, 1.0]) == ((B, C, A), (0.0, 1.0, 1.0))
    group_id = bytes(range(16))
    audit_id = audit_group_id(group_id)
    assert len(audit_id) == len(group_id) and audit_id != group_id
    assert audit_group_id(group_id) == audit_id  # every member derives the same one


def _reduce(inputs: list[torch.Tensor], ranks: list[int]) -> torch.Tensor:
    async def run() -> torch.Tensor:
        reducer = RobustPartReducer([inputs[0].shape], len(inputs), "centered_clip", sender_ranks=ranks)
        results = await asyncio.gather(*(reducer.accumulate_part(i, 0, x) for i, x in enumerate(inputs)))
        assert all(torch.equal(results[0], r) for r in results)
        return results[0]

    return asyncio.run(run())


def test_a_reducer_stacks_its_inputs_by_rank_so_the_numbering_of_senders_does_not_matter() -> None:
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(257, generator=gen) * (i + 1) for i in range(5)]
    # the same senders numbered in another order: sender i of the second reducer is sender
    # perm[i] of the first, and ranks follow the senders, not their numbers
    perm = [3, 0, 4, 1, 2]
    first = _reduce(inputs, list(range(5)))
    second = _reduce([inputs[j] for j in perm], perm)
    assert torch.equal(first, second)
