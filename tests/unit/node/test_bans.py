"""BanList: growing bans, capped, with counted reasons."""

from __future__ import annotations

from node.bans import BanList


def test_bans_double_up_to_the_cap() -> None:
    bans = BanList(base_s=1.0, max_s=10.0)
    peer = b"\x00\x02ab"
    assert [bans.ban(peer, "bad: x") for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert bans.is_banned(peer) and bans.strikes(peer) == 5 and bans.reasons["bad"] == 5


def test_a_peer_banned_thousands_of_times_stays_at_the_cap() -> None:
    """2 ** 1024 overflows a float: a flooding peer re-banned on every stream crashed the guard."""
    bans = BanList(base_s=60.0, max_s=3600.0)
    for _ in range(1500):
        duration = bans.ban(b"\x00\x02ab", "oversized")
    assert duration == 3600.0
