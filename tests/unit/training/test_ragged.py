"""The attention layout of sequences after a shared prefix: every real row once, grids no wider than needed."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.ragged import plan


def _rows_by_sequence(lengths: list[int]) -> list[list[int]]:
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [list(range(start, start + n)) for start, n in zip(starts, lengths, strict=True)]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 64), st.lists(st.integers(0, 96), min_size=1, max_size=12))
def test_every_real_row_sits_once_in_its_sequence_row_of_a_grid(prefix: int, lengths: list[int]) -> None:
    ragged = plan(prefix, lengths)
    assert ragged.prefix == prefix
    seen: list[int] = []
    sequences = _rows_by_sequence(lengths)
    for bucket in ragged.buckets:
        assert bucket.flat.shape == bucket.grid.shape and bucket.flat.dtype == torch.long
        assert bucket.grid.numel() == 0 or int(bucket.grid.max()) < bucket.batch * bucket.time
        flat, grid = bucket.flat.tolist(), bucket.grid.tolist()
        # each grid row holds one whole sequence, from its first row on, and the widest fills its row
        for row in range(bucket.batch):
            members = [f for f, g in zip(flat, grid, strict=True) if g // bucket.time == row]
            columns = [g % bucket.time for g in grid if g // bucket.time == row]
            assert members in sequences and columns == list(range(len(members)))
        assert max(g % bucket.time for g in grid) == bucket.time - 1
        seen += flat
    assert sorted(seen) == list(range(sum(lengths)))


def test_similar_lengths_share_one_grid_and_an_outlier_gets_its_own() -> None:
    assert [(b.batch, b.time) for b in plan(17, [18, 20, 19, 17]).buckets] == [(4, 20)]
    assert [(b.batch, b.time) for b in plan(17, [5, 120, 6, 4, 7]).buckets] == [(1, 120), (4, 7)]
    assert plan(3, [0, 0]).buckets == ()
