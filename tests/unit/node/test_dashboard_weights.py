"""The weights panel's pages (`node.dashboard.weights_view`): by version, newest first, each linked to its neighbours."""

from __future__ import annotations

from typing import Any

import pytest

from node.dashboard.snapshot import VersionSpread
from node.dashboard.weights_view import newest_first, page_url, weights_page

ORDER = newest_first(VersionSpread(v) for v in (10, 50, 30, 20, 40))  # versions need not be contiguous


def page(before: int | None, limit: int = 2) -> dict[str, Any]:
    return weights_page(ORDER, limit=limit, before=before, receipts_url=lambda **q: f"/api/receipts?{q}")


def versions(answer: dict[str, Any]) -> list[int]:
    return [v["version"] for v in answer["versions"]]


def test_the_first_page_is_the_newest_versions_with_a_link_to_the_older_ones() -> None:
    first = page(None)
    assert versions(first) == [50, 40] and first["total"] == 5 and first["offset"] == 0
    assert first["older_url"] == page_url(2, 40) == "/api/weights?limit=2&before=40"
    assert first["newer_url"] is None


@pytest.mark.parametrize(
    ("before", "expected", "offset"),
    [(40, [30, 20], 2), (35, [30, 20], 2), (1000, [50, 40], 0), (20, [10], 4), (10, [], 5), (0, [], 5)],
)
def test_a_page_is_the_versions_below_before_whether_or_not_it_is_a_version(
    before: int, expected: list[int], offset: int
) -> None:
    answer = page(before)
    assert (versions(answer), answer["offset"], answer["before"]) == (expected, offset, before)


def test_the_older_and_newer_links_walk_every_version_once_each_way() -> None:
    forward, answer = [], page(None)
    while True:
        forward.append(versions(answer))
        if answer["older_url"] is None:
            break
        answer = page(int(answer["older_url"].rsplit("before=", 1)[1]))
    assert forward == [[50, 40], [30, 20], [10]]
    backward = [versions(answer)]
    while answer["newer_url"] is not None:
        before = answer["newer_url"].rpartition("before=")[2]
        answer = page(int(before) if before.isdigit() else None)
        backward.append(versions(answer))
    assert backward == forward[::-1]


def test_one_page_that_holds_every_version_links_nowhere() -> None:
    answer = page(None, limit=20)
    assert versions(answer) == [50, 40, 30, 20, 10]
    assert answer["older_url"] is None and answer["newer_url"] is None
