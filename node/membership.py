"""DHT membership: publishing this node's signed record, refreshing it, leaving, and discovery.

Each node stores its record under the run's node-records key, in its own `hn:<PeerID>`
subkey, signed by its identity and expiring after `record_ttl_s`. `Membership` is a runtime
service: a task on the node's loop re-publishes the record; a clean leave publishes a LEFT record that discovery drops at once; a
killed node's record simply expires, so it vanishes from discovery within one TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
from hivemind.p2p import PeerID

from node.identity import Identity
from node.signed_records import SignedRecords, verified_values
from protocol.dht_keys import node_records_key
from protocol.errors import IdentityError, InvalidMessage
from protocol.limits import MAX_NODE_RECORD_TTL_S
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, NodeStatus, Reachability, Role
from protocol.text import name_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveNode:
    """A node found through discovery, with its verified record."""

    record: NodeRecord
    expires_at: float
    seq: int

    @property
    def peer_id(self) -> PeerID:
        return PeerID(self.record.peer_id)

    @property
    def short_id(self) -> str:
        return self.peer_id.to_base58()[-8:]


def local_capabilities() -> Capabilities:
    """What this machine offers: CPU count, memory and the accelerator torch sees, if torch is loaded."""
    accelerator = ""
    torch = __import__("sys").modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        accelerator = name_text(torch.cuda.get_device_name(0))[:128]
    return Capabilities(
        cpu_count=os.cpu_count() or 1, memory_bytes=psutil.virtual_memory().total, accelerator=accelerator
    )


async def fetch_run_records(dht: Any, run_id: str, now: float | None = None) -> dict[bytes, LiveNode]:
    """Every verified record under the run's node-records key, by PeerID, including LEFT ones."""
    key = node_records_key(run_id)
    found = await dht.get(key, latest=True, return_future=True)
    records: dict[bytes, LiveNode] = {}
    for value in verified_values(
        found, key=key, domain=NODE_RECORD_DOMAIN, run_id=run_id, max_ttl_s=MAX_NODE_RECORD_TTL_S, now=now
    ):
        try:
            record = NodeRecord.from_payload(value.payload)
        except (InvalidMessage, ValueError) as exc:
            logger.info("ignoring invalid node record of %s: %s", PeerID(value.signer).to_base58(), exc)
            continue
        if record.peer_id == value.signer:
            records[value.signer] = LiveNode(record=record, expires_at=value.expires_at, seq=value.seq)
    return records


async def discover(dht: Any, run_id: str, role: Role | None = None) -> list[LiveNode]:
    """The live nodes of `run_id` (optionally only those with `role`), oldest first."""
    nodes = [
        node
        for node in (await fetch_run_records(dht, run_id)).values()
        if node.record.status == NodeStatus.ONLINE and (role is None or role in node.record.roles)
    ]
    return sorted(nodes, key=lambda node: node.record.started_at)


class Membership:
    """This node's record in the run: published at `start`, refreshed by a task, withdrawn at `stop`."""

    name = "membership"

    def __init__(
        self,
        dht: Any,
        identity: Identity,
        *,
        run_id: str,
        roles: list[Role],
        public_name: str,
        addresses: list[str],
        record_ttl_s: float,
        refresh_interval_s: float,
        software_version: str,
        protocol_version: int,
        check_identity: bool = True,
        attestations: Callable[[], tuple[bytes, ...]] = tuple,
    ):
        """`attestations`: this node's current address attestations (`node.attestations`), which
        every publish puts in the record, so that a lapsed one leaves it at the next refresh."""
        self.dht = dht
        self.attestations = attestations
        self.identity = identity
        self.run_id = run_id
        self.record_ttl_s = record_ttl_s
        self.refresh_interval_s = refresh_interval_s
        self.check_identity = check_identity
        self.record = NodeRecord(
            peer_id=identity.peer_id_bytes,
            roles=tuple(roles),
            public_name=public_name or identity.short_id,
            run_id=run_id,
            software_version=software_version,
            protocol_version=protocol_version,
            capabilities=local_capabilities(),
            addresses=tuple(addresses),
            started_at=time.time(),
            instance_id=secrets.token_bytes(16),
        )
        self._records = SignedRecords(dht, identity)
        self._refresher: asyncio.Task[None] | None = None
        self.last_publish_ok = False

    async def start(self) -> None:
        """Refuse a live duplicate of this identity, publish the record and keep refreshing it."""
        if self.check_identity:
            await self.check_identity_free()
        first_at = asyncio.get_running_loop().time()
        await self.publish()
        self._refresher = asyncio.create_task(self._refresh_loop(first_at), name="membership-refresh")

    async def stop(self) -> None:
        """Stop refreshing and publish a LEFT record so that discovery drops this node at once."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        try:
            await self.publish(NodeStatus.LEFT)
        except Exception as exc:
            logger.warning("could not withdraw node record: %r", exc)

    async def check_identity_free(self) -> None:
        """Refuse to run if another live process (anywhere) publishes records with this identity.

        A record from another instance may be the stale leftover of a crashed process, so we
        wait one refresh interval and only refuse if that instance refreshed it meanwhile.
        """
        me = self.identity.peer_id_bytes
        first = (await fetch_run_records(self.dht, self.run_id)).get(me)
        if first is None or first.record.instance_id == self.record.instance_id:
            return
        if first.record.status == NodeStatus.LEFT:
            return
        deadline = time.monotonic() + self.refresh_interval_s * 1.5 + 1.0
        while time.monotonic() < deadline:
            await asyncio.sleep(min(1.0, self.refresh_interval_s / 4))
            later = (await fetch_run_records(self.dht, self.run_id)).get(me)
            if (
                later is not None
                and later.record.instance_id == first.record.instance_id
                and later.seq > first.seq
            ):
                if later.record.status == NodeStatus.LEFT:
                    return
                raise IdentityError(
                    f"identity {self.identity.path} (peer {self.identity.short_id}) is already used by a running "
                    f"node named {later.record.public_name!r} at {', '.join(later.record.addresses) or 'unknown'}; "
                    "two nodes must never share one identity. Stop the other node, or start this one with its own "
                    "--identity PATH"
                )

    async def announce_roles(self, roles: list[Role]) -> bool:
        """Publish the record again, now with `roles` (a role is announced once what serves it is ready)."""
        self.record = self.record.model_copy(update={"roles": tuple(roles)})
        return await self.publish()

    async def report_reachability(self, reachability: Reachability) -> bool:
        """Publish the record again if the dial-back check changed what it says about reaching us,
        or brought new address attestations."""
        if reachability == self.record.reachability and self.attestations() == self.record.attestations:
            return True
        self.record = self.record.model_copy(update={"reachability": reachability})
        return await self.publish()

    async def publish(self, status: NodeStatus = NodeStatus.ONLINE) -> bool:
        """Sign and store the current record; return whether at least one DHT peer accepted it."""
        if status != self.record.status:
            self.record = self.record.model_copy(update={"status": status})
        attestations = self.attestations()
        if attestations != self.record.attestations:
            self.record = self.record.model_copy(update={"attestations": attestations})
        ok = await self._records.store(
            node_records_key(self.run_id),
            domain=NODE_RECORD_DOMAIN,
            run_id=self.run_id,
            payload=self.record.to_payload(),
            ttl_s=self.record_ttl_s,
        )
        self.last_publish_ok = ok
        if not ok:
            logger.warning(
                "[%s] node record was not stored by any DHT peer; will retry", self.identity.short_id
            )
        return ok

    async def _refresh_loop(self, first_at: float) -> None:
        # Fixed rate, measured from the start of each publish (the first one's at `first_at`): a
        # store that is slow under load must not push the next refresh back, or the record
        # expires between refreshes.
        loop = asyncio.get_running_loop()
        next_at = first_at
        while True:
            next_at += self.refresh_interval_s if self.last_publish_ok else 1.0
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at, loop.time() - self.refresh_interval_s)
            try:
                await asyncio.wait_for(self.publish(), timeout=self.refresh_interval_s * 2)
            except Exception as exc:  # the DHT may be shutting down; keep the node alive regardless
                logger.warning("refreshing node record failed: %r", exc)
