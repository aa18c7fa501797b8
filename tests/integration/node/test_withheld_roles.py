"""A role whose handler starts after the node is announced only once it serves: until then peers that
discover the node do not see it in that role (and so do not dial a protocol it does not serve yet)."""

from __future__ import annotations

from pathlib import Path

from node.config import NodeConfig
from node.node import HivenetNode
from node.swarm import wait_until
from protocol.node_record import Role

RUN = "withheld-roles"


def _node(root: Path, name: str, peers: list[str], roles: list[Role], *, seed: bool = False) -> HivenetNode:
    config = NodeConfig(
        identity_path=root / f"{name}.key",
        initial_peers=peers,
        roles=roles,
        public_name=name,
        run_id=RUN,
        host="127.0.0.1",
        refresh_interval_s=0.5,
        record_ttl_s=5.0,
    )
    return HivenetNode(config, dht_only=seed)


def test_a_withheld_role_is_announced_only_when_the_node_says_it_serves(tmp_path: Path) -> None:
    seed = _node(tmp_path, "seed", [], [Role.SEED], seed=True)
    seed.start()
    node = _node(tmp_path, "trainer", seed.multiaddrs(), [Role.TRAINER, Role.INFERENCE])
    watcher = _node(tmp_path, "watcher", seed.multiaddrs(), [Role.INFERENCE])
    try:
        node.start(withheld_roles=[Role.TRAINER])
        watcher.start()

        def roles_seen() -> set[Role] | None:
            found = [n for n in watcher.discover() if n.record.peer_id == node.identity.peer_id_bytes]
            return set(found[0].record.roles) if found else None

        assert wait_until(lambda: roles_seen() is not None, timeout_s=30)
        assert roles_seen() == {Role.INFERENCE}  # found, but not as a trainer yet
        assert not [n for n in watcher.discover(Role.TRAINER)]
        node.announce_roles()
        assert wait_until(lambda: roles_seen() == {Role.TRAINER, Role.INFERENCE}, timeout_s=30)
    finally:
        for n in (watcher, node, seed):
            n.stop()


def test_a_node_whose_every_role_is_withheld_publishes_its_record_when_it_announces(tmp_path: Path) -> None:
    """An RL trainer (trainer and validator, both served by handlers started after the node) has no
    role to announce at first: its record appears, with both, once it says it serves."""
    seed = _node(tmp_path, "seed", [], [Role.SEED], seed=True)
    seed.start()
    node = _node(tmp_path, "rl-trainer", seed.multiaddrs(), [Role.TRAINER, Role.VALIDATOR])
    watcher = _node(tmp_path, "watcher", seed.multiaddrs(), [Role.INFERENCE])
    try:
        node.start(withheld_roles=[Role.TRAINER, Role.VALIDATOR])
        watcher.start()
        assert node.membership is None and node.state == "running"
        node.announce_roles()
        assert wait_until(
            lambda: (
                {n.record.peer_id for n in watcher.discover(Role.VALIDATOR)} == {node.identity.peer_id_bytes}
            ),
            timeout_s=30,
        )
    finally:
        for n in (watcher, node, seed):
            n.stop()
