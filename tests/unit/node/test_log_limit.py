"""LogOncePer: a line per key per interval, and a bounded memory of keys."""

from __future__ import annotations

import pytest

from node.log_limit import LogOncePer


def test_a_key_is_logged_once_per_interval_and_keys_are_forgotten_oldest_first() -> None:
    now = [0.0]
    once = LogOncePer(10.0, max_keys=2, clock=lambda: now[0])
    assert once("a") and not once("a") and once("b")
    now[0] = 9.9
    assert not once("a") and not once("b")
    now[0] = 10.0
    assert once("a") and not once("a")
    assert once("c")  # a third key: the least recently logged ("b") is forgotten
    assert once("b") and not once("c")
    with pytest.raises(ValueError):
        LogOncePer(0)
