"""The running peer: one runtime hosting identity, DHT, bootstrap, membership, status and services.

`HivenetNode.start()` starts the node's event loop (`node.runtime.NodeRuntime`), claims the
identity, starts the DHT, dials the seeds, refuses to run if the identity is live elsewhere
and publishes the node record; `add_service` hosts more components on the same loop (the
weight broadcast, averaging, ...); `stop()` stops them in reverse order and leaves cleanly. An
announced node whose config names a ledger also runs the receipts exchange (`node.receipts`): its
components hand the receipts they sign to `receipt_sink`, and it signs one for each seed that
answered its bootstrap, and for the seed that dials it back (`check_reachability`). That seed's
address attestation goes into the node's `attestations` and its record; once checked, the node
re-checks every quarter hour to renew them (`node.attestations`). A seed (`dht_only`) signs
attestations with its identity key. Role-specific work (training, inference) is attached on top of
a started node.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import hivemind
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from hivemind.dht.node import DHTNode
from multiaddr import Multiaddr

from node.attestations import AttestationBook, AttestationRenewal, trusted_attesters
from node.bans import BanList
from node.config import NodeConfig
from node.dht_node import BootstrapStopped, SeedStatus, bootstrap, start_dht
from node.dialable import parse_networks
from node.identity import Identity, create_identity, load_or_create_identity
from node.ledger import Ledger
from node.logs import set_log_peer
from node.membership import LiveNode, Membership, discover
from node.metrics import NodeMetrics
from node.own_credit import OwnCredit
from node.reachability import DialBackOutcome, request_dial_back, serve_dial_back
from node.receipts import ReceiptExchange, ReceiptsConfig
from node.receipts.client import PullResult
from node.receipts.seeds import bootstrap_receipts, dial_back_receipt
from node.rejoin import MIN_REJOIN_CHECK_INTERVAL_S, Rejoin, count_dht_neighbours
from node.runtime import NodeRuntime, Service, in_dht
from node.status import NodeStatusSnapshot, StatusServer, write_status_file
from protocol.node_record import Reachability, Role
from protocol.version import PROTOCOL_VERSION, SOFTWARE_VERSION

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=Service)
T = TypeVar("T")

_PEER_COUNT_TIMEOUT_S = 5.0


async def _visible_maddrs(_dht: hivemind.DHT, node: DHTNode) -> list[Multiaddr]:
    """This node's multiaddrs as its p2pd sees them (run in the DHT process; `DHT.get_visible_maddrs`
    would block the calling loop)."""
    return await node.p2p.get_visible_maddrs()


async def _routing_table_size(_dht: hivemind.DHT, node: DHTNode) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)


class HivenetNode:
    """One hivenet peer in this process (its DHT and p2pd run in child processes).

    `announce=False` makes a client that publishes no node record (`hivenet peers`, `weights`);
    `ephemeral_identity=True` uses a throwaway key that is deleted once p2pd has read it.
    """

    def __init__(
        self,
        config: NodeConfig,
        *,
        dht_only: bool = False,
        announce: bool = True,
        ephemeral_identity: bool = False,
        client_mode: bool = False,
    ):
        self.config = config
        self.dht_only = dht_only
        self.announce = announce
        self.client_mode = client_mode
        self._ephemeral_dir: Path | None = None
        if ephemeral_identity:
            self._ephemeral_dir = Path(tempfile.mkdtemp(prefix="hivenet-ephemeral-"))
            self.identity: Identity = create_identity(self._ephemeral_dir / "ephemeral.key")
        else:
            self.identity = load_or_create_identity(config.identity_path)
        set_log_peer(self.identity.short_id)
        self.runtime = NodeRuntime(f"node-{self.identity.short_id}")
        self.dht: hivemind.DHT | None = None
        self.membership: Membership | None = None
        self.seed_statuses: list[SeedStatus] = []
        self.live_nodes: list[LiveNode] = []
        self.started_at = time.time()
        self.state = "starting"
        self.metrics = NodeMetrics()
        """This node's Prometheus metrics; the services and roles it hosts count into it."""
        self._status_server = (
            StatusServer(config.status_port, self.metrics, host=config.metrics_host)
            if config.status_port is not None
            else None
        )
        self.ledger: Ledger | None = None
        self.receipts: ReceiptExchange | None = None
        """The receipts exchange, on an announced node whose config names a ledger (`ledger_path`)."""
        self.own_credit = OwnCredit(lambda: self.ledger, self.identity.peer_id_bytes)
        """This node's credit from its ledger: what its contribution line, /status and /metrics show."""
        self.attestations = AttestationBook(
            self.identity.peer_id_bytes,
            trusted_attesters(config.initial_peers),
            parse_networks(config.dialable_networks),
        )
        """Whose address attestations this node believes (its initial peers), and those its seeds gave it:
        hand it to the services that dial peers or announce this node (`WeightBroadcast(attestations=...)`)."""
        self.rejoin: Rejoin | None = None
        """Dials the seeds again after an outage emptied the DHT's routing table (a node with seeds)."""
        self.renewal: AttestationRenewal | None = None
        """Re-checks reachability to renew the attestations, from the first check of an announced node."""

    @property
    def short_id(self) -> str:
        return self.identity.short_id

    def call(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run `coro` on this node's event loop and wait for its result."""
        return self.runtime.call(coro, timeout_s=timeout_s)

    def add_service(self, service: S) -> S:
        """Start `service` on this node's loop; it is stopped (in reverse order) when the node stops."""
        self.runtime.add_service(service)
        return service

    def start(
        self, should_stop: Callable[[], bool] | None = None, *, withheld_roles: Collection[Role] = ()
    ) -> None:
        """Join the swarm; raises IdentityError / PeerUnreachable with a fix on failure.

        `should_stop` is polled while seeds are retried; if it turns true, start gives up
        with KeyboardInterrupt after releasing everything it took. `withheld_roles` are left out of
        the node record until `announce_roles` (a role whose stream handler a component registers
        after the node started: peers that found it earlier would dial a protocol not served yet).
        """
        if self._ephemeral_dir is None:
            self.identity.lock()
        try:
            self.runtime.start()
            if self._status_server is not None:
                self.add_service(self._status_server)
            self.dht = start_dht(self.config, self.identity, client_mode=self.client_mode)
            if self._ephemeral_dir is not None:  # p2pd has read the key; nothing stays on disk
                shutil.rmtree(self._ephemeral_dir, ignore_errors=True)
            try:
                self.seed_statuses = self.call(
                    bootstrap(
                        self.dht, self.config.initial_peers, self.config.bootstrap_timeout_s, should_stop
                    )
                )
            except BootstrapStopped:
                raise KeyboardInterrupt("stopped while dialling the initial peers") from None
            if self.config.initial_peers:
                self.rejoin = self.add_service(self._rejoin())
            if self.dht_only:
                key = self.identity.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
                self.call(
                    in_dht(
                        self.dht,
                        serve_dial_back,
                        attester_key=key,
                        dialable_networks=tuple(self.config.dialable_networks),
                    )
                )
            if self.announce:
                published = [role for role in self.config.roles if role not in withheld_roles]
                if published:  # with every role withheld, the record waits for `announce_roles`
                    self.membership = self.add_service(self._membership(published))
                if self.config.ledger_path is not None and not self.dht_only:
                    self._start_receipts(self.config.ledger_path)
                    self._sign_bootstrap_receipts()
        except BaseException:
            self.shutdown()
            raise
        self.state = "running"
        if self.announce:
            logger.info("joined run %r as %s", self.config.run_id, ",".join(self.config.roles))
        self.refresh_view()

    def announce_roles(self) -> None:
        """Publish the node record with every configured role (those `start` withheld included)."""
        if not self.announce:
            return
        if self.membership is None:
            self.membership = self.add_service(self._membership(list(self.config.roles)))
        else:
            self.call(self.membership.announce_roles(list(self.config.roles)))

    def _rejoin(self) -> Rejoin:
        dht = self.dht
        interval_s = max(self.config.refresh_interval_s, MIN_REJOIN_CHECK_INTERVAL_S)

        async def redial() -> object:
            return await bootstrap(dht, self.config.initial_peers, timeout_s=interval_s)

        return Rejoin(
            lambda: in_dht(dht, count_dht_neighbours), redial, interval_s=interval_s, owner=self.short_id
        )

    def _membership(self, roles: list[Role]) -> Membership:
        assert self.dht is not None
        return Membership(
            self.dht,
            self.identity,
            run_id=self.config.run_id,
            roles=roles,
            public_name=self.config.public_name,
            addresses=self.multiaddrs(),
            record_ttl_s=self.config.record_ttl_s,
            refresh_interval_s=self.config.refresh_interval_s,
            software_version=SOFTWARE_VERSION,
            protocol_version=PROTOCOL_VERSION,
            check_identity=bool(self.config.initial_peers),
            attestations=self.attestations.current,
        )

    def _start_receipts(self, path: Path) -> None:
        assert self.dht is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(path, self.config.run_id)
        config = ReceiptsConfig(trusted_signers=self.config.trusted_signers)
        bans = BanList(
            config.ban_base_s, config.ban_max_s, owner=self.short_id, on_ban=self.metrics.peer_banned
        )
        self.receipts = self.add_service(
            ReceiptExchange(
                dht=self.dht,
                identity=self.identity,
                ledger=self.ledger,
                config=config,
                bans=bans,
                on_pulled=self._count_pulled_receipts,
                trusted_attesters=self.attestations.trusted,
                dialable_networks=self.attestations.dialable_networks,
            )
        )

    def _count_pulled_receipts(self, pulled: PullResult) -> None:
        self.metrics.receipts_pulled(
            stored=pulled.added, duplicate=pulled.duplicates, expired=pulled.skipped, deferred=pulled.capped
        )

    def _sign_bootstrap_receipts(self) -> None:
        """Sign a receipt for each seed that answered this node's bootstrap (never one that did not)."""
        sink = self.receipt_sink
        if sink is not None:
            answered = [status.address for status in self.seed_statuses if status.reached]
            sink(bootstrap_receipts(self.identity, self.config.run_id, answered))

    def check_reachability(
        self, seeds: list[str] | None = None, addresses: list[str] | None = None, *, timeout_s: float = 120.0
    ) -> DialBackOutcome:
        """Ask `seeds` (default: those that answered the bootstrap) to dial this node back at
        `addresses` (default: its own TCP addresses); the seed that reached it earns a receipt, and
        its attestation goes into the record. An announced node re-checks from then on
        (`AttestationRenewal`)."""
        if self.membership is not None and self.renewal is None and self.state == "running":
            self.renewal = self.add_service(AttestationRenewal(self._renew_attestations))
        return self.call(self._check_reachability(seeds, addresses), timeout_s=timeout_s)

    async def _renew_attestations(self) -> DialBackOutcome:
        """A re-check, asking first the seed whose attestation lapses soonest. It signs no receipt:
        one per check every quarter hour would grow every ledger for a service already credited."""
        seeds = [status.address for status in self.seed_statuses if status.reached]
        return await self._check_reachability(self.attestations.renewal_order(seeds), None, receipt=False)

    async def _check_reachability(
        self, seeds: list[str] | None, addresses: list[str] | None, *, receipt: bool = True
    ) -> DialBackOutcome:
        assert self.dht is not None
        if seeds is None:
            seeds = [status.address for status in self.seed_statuses if status.reached]
        if addresses is None:  # asked of the DHT process without blocking this loop
            maddrs = await in_dht(self.dht, _visible_maddrs)
            addresses = [str(address).split("/p2p/")[0] for address in maddrs]
        outcome = await in_dht(self.dht, request_dial_back, seeds=seeds, addresses=addresses)
        if outcome.attestation is not None:
            self.attestations.add(outcome.attestation)
        if self.membership is not None and outcome.answered:  # the swarm table shows it (self-reported)
            found = Reachability.PUBLIC if outcome.reachable else Reachability.PRIVATE
            await self.membership.report_reachability(found)
        sink = self.receipt_sink
        if receipt and outcome.reachable and outcome.seed is not None and sink is not None:
            signed = dial_back_receipt(self.identity, self.config.run_id, outcome.seed)
            if signed is not None:
                sink([signed])
        return outcome

    @property
    def receipt_sink(self) -> Callable[[list[bytes]], None] | None:
        """Where the components of this node hand the receipts they sign (None: no ledger, not kept)."""
        return self.receipts.record if self.receipts is not None else None

    def multiaddrs(self) -> list[str]:
        """Full multiaddrs of this node (with /p2p/), as others should dial them."""
        assert self.dht is not None
        return [str(addr) for addr in self.dht.get_visible_maddrs()]

    def discover(self, role: Role | None = None, run_id: str | None = None) -> list[LiveNode]:
        """The live nodes of this node's run (or `run_id`), optionally only those with `role`."""
        assert self.dht is not None
        return self.call(discover(self.dht, run_id or self.config.run_id, role))

    def refresh_view(self) -> None:
        """Re-read who is live and publish the status snapshot."""
        if self.dht is not None and self.state == "running" and self.announce:
            try:
                self.live_nodes = self.discover()
            except Exception as exc:
                logger.warning("discovery failed: %r", exc)
            else:
                self.metrics.set_live_peers(
                    [role.value for role in node.record.roles] for node in self.live_nodes
                )
        self._write_status()

    def dht_peer_count(self) -> int:
        if self.dht is None:
            return 0
        try:
            return int(self.call(in_dht(self.dht, _routing_table_size), timeout_s=_PEER_COUNT_TIMEOUT_S))
        except Exception:
            return 0

    def snapshot(self) -> NodeStatusSnapshot:
        credit = self.own_credit.figures()
        if credit is not None:
            self.metrics.set_credit(total=credit.total, recent=credit.recent, untrusted=credit.untrusted)
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
            metrics=self.metrics.figures(),
            credit=credit,
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
        """Leave cleanly: stop the services (the membership service withdraws the record), then the DHT."""
        if self.state == "running":
            self.state = "leaving"
            self._write_status()
        self.shutdown()

    def shutdown(self) -> None:
        """Release everything this node holds: services (last started first), the loop, the DHT."""
        self.runtime.close()
        self.membership = None
        self.renewal = None
        self.receipts = None
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
        if self._ephemeral_dir is not None:
            shutil.rmtree(self._ephemeral_dir, ignore_errors=True)
        else:
            self.identity.unlock()
        was_leaving = self.state == "leaving"
        self.state = "stopped"
        if was_leaving and self.config.status_file is not None:
            write_status_file(self.config.status_file, self.snapshot())
