"""Logging what strangers cause without letting them flood the log: a line per source per interval."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["LogOncePer"]


class LogOncePer:
    """`once(key)` is True at most once per `interval_s` for each key, so a caller logs a line about a
    source (a peer, a record) once per interval however often that source shows up. It remembers at
    most `max_keys` keys, forgetting the least recently logged first, since keys may come from anyone."""

    def __init__(
        self, interval_s: float, *, max_keys: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval_s <= 0 or max_keys < 1:
            raise ValueError(f"need interval_s > 0 and max_keys >= 1, got {interval_s}, {max_keys}")
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._logged_at: OrderedDict[Hashable, float] = OrderedDict()

    def __call__(self, key: Hashable) -> bool:
        now = self._clock()
        last = self._logged_at.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._logged_at[key] = now
        self._logged_at.move_to_end(key)
        while len(self._logged_at) > self.max_keys:
            self._logged_at.popitem(last=False)
        return True
