"""A node's libp2p port already taken is one clear error before p2pd starts: by another program,
or by another hivenet node, whose p2pd listens with SO_REUSEPORT and would otherwise share the
port with the second one (two seeds answering on one address)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import NodeConfig
from node.node import HivenetNode
from protocol.errors import ConfigError
from protocol.node_record import Role
from tests.helpers.ports import held_port


def _seed(tmp_path: Path, name: str, port: int) -> HivenetNode:
    config = NodeConfig(
        identity_path=tmp_path / f"{name}.key", roles=[Role.SEED], host="127.0.0.1", port=port, run_id="ports"
    )
    return HivenetNode(config, dht_only=True)


def test_a_port_held_by_another_program_or_another_seed_is_refused(tmp_path: Path) -> None:
    with held_port() as held, pytest.raises(ConfigError, match=rf"127.0.0.1:{held} .*pick another --port"):
        _seed(tmp_path, "a", held).start()

    first = _seed(tmp_path, "first", 0)
    first.start()
    try:
        port = int(first.multiaddrs()[0].split("/tcp/")[1].split("/")[0])
        second = _seed(tmp_path, "second", port)
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{port}"):
            second.start()
    finally:
        first.shutdown()
