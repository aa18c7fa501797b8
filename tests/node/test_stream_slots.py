"""StreamSlots: the total and per-peer counts follow the streams held, however a stream ends."""

from __future__ import annotations

import pytest

from node.stream_slots import StreamSlots


def test_slots_count_per_peer_and_are_released_on_error() -> None:
    slots = StreamSlots()
    with slots.held(b"a"), slots.held(b"a"), slots.held(b"b"):
        assert (slots.total, slots.of(b"a"), slots.of(b"b"), slots.of(b"c"), slots.peers) == (3, 2, 1, 0, 2)
    assert (slots.total, slots.of(b"a"), slots.peers) == (0, 0, 0)
    with pytest.raises(RuntimeError), slots.held(b"a"):
        assert slots.total == 1
        raise RuntimeError("the stream failed")
    assert (slots.total, slots.of(b"a"), slots.peers) == (0, 0, 0)
