"""A fetch's chunk that finishes storing after the broadcast stopped is no error (it was a task
exception never retrieved, logged at shutdown of every simulated run that stopped mid-fetch)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from node.broadcast.broadcaster import WeightBroadcast
from node.broadcast.config import BroadcastConfig
from node.identity import create_identity


def test_callbacks_of_a_fetch_after_the_broadcast_stopped_do_nothing(tmp_path: Path) -> None:
    broadcast = WeightBroadcast(
        dht=mock.Mock(),
        identity=create_identity(tmp_path / "node.key"),
        config=BroadcastConfig(store_dir=tmp_path / "store"),
    )
    entry = mock.Mock()
    broadcast.chunk_stored(entry, 3)  # raised BroadcastNotStarted from inside the fetch's store task
    broadcast.chunk_wanted(entry, 3)
    assert not entry.mock_calls
