"""A node page's credit history drawn from its contributor's timeline equals summing its receipts bucket by bucket."""

from __future__ import annotations

from array import array
from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from node.dashboard.snapshot import ContributorTimeline, bucket_of, time_edges

_times = st.floats(min_value=1_000.0, max_value=2_000.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    receipts=st.lists(st.tuples(_times, st.floats(min_value=0.0, max_value=50.0)), max_size=60),
    start=_times,
    end=_times,
    pick_edges=st.booleans(),
)
def test_cumulative_credit_at_the_edges_matches_the_buckets(
    receipts: list[tuple[float, float]], start: float, end: float, pick_edges: bool
) -> None:
    edges = time_edges(min(start, end), max(start, end))
    if pick_edges and receipts:  # receipts issued exactly on an edge land in the bucket that edge starts
        receipts = [(edges[i % len(edges)], credit) for i, (_, credit) in enumerate(receipts)]
    receipts.sort()
    timeline = ContributorTimeline(
        issued=array("d", (at for at, _ in receipts)),
        cumulative=array("d", accumulate(credit for _, credit in receipts)),
    )
    earned = [0.0] * (len(edges) - 1)
    for issued_at, credit in receipts:
        earned[bucket_of(edges, issued_at)] += credit
    expected = list(accumulate(earned))
    got = timeline.cumulative_at(edges)
    assert len(got) == len(expected)
    assert all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in zip(got, expected, strict=True))
