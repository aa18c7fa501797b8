"""The running peer: wires identity, DHT, bootstrap, membership and status together.

`HivenetNode.start()` claims the identity, starts the DHT, dials the seeds, refuses to run
if the identity is live elsewhere, and publishes the node record; `stop()` leaves cleanly.
Role-specific work (training, inference) is attached by the CLI on top of a started node.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from functools import partial

import hivemind
from hivemind.dht.node import DHTNode

from node.config import NodeConfig
from node.dht_node import SeedStatus, bootstrap, start_dht
from node.identity import Identity, load_or_create_identity
from node.logs import set_log_peer
from node.membership import LiveNode, Membership, discover
from node.reachability import serve_dial_back
from node.status import NodeStatusSnapshot, StatusServer, write_status_file
from protocol.version import PROTOCOL_VERSION, SOFTWARE_VERSION

logger = logging.getLogger(__name__)


async def _routing_table_size(_dht: hivemind.DHT, node: DHTNode) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)


class HivenetNode:
    """One hivenet peer in this process (its DHT and p2pd run in child processes)."""

    def __init__(self, config: NodeConfig, *, dht_only: bool = False):
        self.config = config
        self.dht_only = dht_only
        self.identity: Identity = load_or_create_identity(config.identity_path)
        set_log_peer(self.identity.short_id)
        self.dht: hivemind.DHT | None = None
        self.membership: Membership | None = None
        self.seed_statuses: list[SeedStatus] = []
        self.live_nodes: list[LiveNode] = []
        self.started_at = time.time()
        self.state = "starting"
        self._status_server = StatusServer(config.status_port) if config.status_port is not None else None

    @property
    def short_id(self) -> str:
        return self.identity.short_id

    def start(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Join the swarm; raises IdentityError / PeerUnreachable with a fix on failure.

        `should_stop` is polled while seeds are retried; if it turns true, start gives up
        with KeyboardInterrupt after releasing everything it took.
        """
        self.identity.lock()
        try:
            self.dht = start_dht(self.config, self.identity)
            self.seed_statuses = bootstrap(
                self.dht, self.config.initial_peers, self.config.bootstrap_timeout_s
            )
            self.membership = Membership(
                self.dht,
                self.identity,
                run_id=self.config.run_id,
                roles=list(self.config.roles),
                public_name=self.config.public_name,
                addresses=self.multiaddrs(),
                record_ttl_s=self.config.record_ttl_s,
                refresh_interval_s=self.config.refresh_interval_s,
                software_version=SOFTWARE_VERSION,
                protocol_version=PROTOCOL_VERSION,
            )
            if self.config.initial_peers:
                self.membership.check_identity_free()
            if self.dht_only:
                self.dht.run_coroutine(serve_dial_back)
            self.membership.start()
        except BaseException:
            self.shutdown()
            raise
        self.state = "running"
        logger.info("joined run %r as %s", self.config.run_id, ",".join(self.config.roles))
        self.refresh_view()

    def multiaddrs(self) -> list[str]:
        """Full multiaddrs of this node (with /p2p/), as others should dial them."""
        assert self.dht is not None
        return [str(addr) for addr in self.dht.get_visible_maddrs()]

    def refresh_view(self) -> None:
        """Re-read who is live and publish the status snapshot."""
        if self.dht is not None and self.state == "running":
            try:
                self.live_nodes = discover(self.dht, self.config.run_id)
            except Exception as exc:
                logger.warning("discovery failed: %r", exc)
        self._write_status()

    def dht_peer_count(self) -> int:
        if self.dht is None:
            return 0
        try:
            return int(
                self.dht.run_coroutine(partial(_routing_table_size), return_future=True).result(timeout=5)
            )
        except Exception:
            return 0

    def snapshot(self) -> NodeStatusSnapshot:
        return NodeStatusSnapshot(
            peer_id=self.identity.peer_id.to_base58(),
            public_name=self.membership.record.public_name if self.membership else self.config.public_name,
            roles=[str(role) for role in self.config.roles],
            run_id=self.config.run_id,
            multiaddrs=self.multiaddrs() if self.dht is not None else [],
            pid=os.getpid(),
            uptime_s=time.time() - self.started_at,
            dht_peers=self.dht_peer_count(),
            live_nodes=[node.peer_id.to_base58() for node in self.live_nodes],
            record_published=bool(self.membership and self.membership.last_publish_ok),
            state=self.state,
        )

    def _write_status(self) -> None:
        if self.config.status_file is None and self._status_server is None:
            return
        snapshot = self.snapshot()
        if self.config.status_file is not None:
            write_status_file(self.config.status_file, snapshot)
        if self._status_server is not None:
            self._status_server.update(snapshot)

    def stop(self) -> None:
        """Leave cleanly: withdraw the node record, then shut the DHT down."""
        if self.state == "running":
            self.state = "leaving"
            self._write_status()
            if self.membership is not None:
                self.membership.leave()
        self.shutdown()

    def shutdown(self) -> None:
        """Release everything this node holds, without announcing anything."""
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
        if self._status_server is not None:
            self._status_server.close()
            self._status_server = None
        self.identity.unlock()
        self.state = "stopped"
