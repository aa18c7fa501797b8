"""The weights panel: the weights versions known from transfer receipts, a page at a time, newest first.

A page is the `limit` newest versions below `before` (a version number; without it, the newest
versions). Paging by version rather than by offset keeps a page still while new versions arrive:
the page redraws on every live update, and an offset would shift its rows by one each time. Each
answer carries the API paths of the next older and newer pages (`older_url`, `newer_url`, null
where there is none) and its position (`offset`: how many versions are newer than the page).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlencode

from node.dashboard.snapshot import VersionSpread

WEIGHTS_PAGE = 20
"""Weights versions per page of the panel (the API takes up to `node.dashboard.data.MAX_LIST`)."""

Json = dict[str, Any]


def newest_first(spreads: Iterable[VersionSpread]) -> list[VersionSpread]:
    return sorted(spreads, key=lambda s: -s.version)


def page_url(limit: int, before: int | None) -> str:
    query: dict[str, int] = {"limit": limit} if before is None else {"limit": limit, "before": before}
    return "/api/weights?" + urlencode(query)


def weights_page(
    order: Sequence[VersionSpread], *, limit: int, before: int | None, receipts_url: Callable[..., str]
) -> Json:
    """The page of `order` (`newest_first`) below `before`; see the module docstring."""
    start = 0 if before is None else bisect_right(order, -before, key=lambda s: -s.version)
    page = order[start : start + limit]
    older = page_url(limit, page[-1].version) if page and start + len(page) < len(order) else None
    newer_start = max(0, start - limit)
    newer = page_url(limit, order[newer_start - 1].version if newer_start else None) if start else None
    return {
        "total": len(order),
        "offset": start,
        "before": before,
        "older_url": older,
        "newer_url": newer,
        "versions": [
            {
                "version": spread.version,
                "receipts": spread.receipts,
                "bytes": spread.byte_count,
                "chunks": spread.chunks,
                "sources": len(spread.sources),
                "fetchers": len(spread.fetchers),
                "first_at": spread.first_at,
                "last_at": spread.last_at,
                "spread_s": spread.last_at - spread.first_at,
                "receipts_url": receipts_url(version=spread.version),
            }
            for spread in page
        ],
    }
