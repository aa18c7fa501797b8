"""DHT membership: publishing this node's signed record, refreshing it, leaving, and discovery.

Each node stores its record under the run's node-records key, in its own `hn:<PeerID>`
subkey, signed by its identity and expiring after `record_ttl_s`. A refresher thread
re-publishes it; a clean leave publishes a LEFT record that discovery drops at once; a
killed node's record simply expires, so it vanishes from discovery within one TTL.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass

import hivemind
import psutil
from hivemind.p2p import PeerID

from node.identity import Identity
from protocol.dht_keys import SIGNED_SUBKEY_PREFIX, node_records_key, signed_subkey
from protocol.envelope import open_envelope, seal
from protocol.errors import IdentityError, InvalidMessage
from protocol.limits import MAX_NODE_RECORD_TTL_S
from protocol.node_record import NODE_RECORD_DOMAIN, Capabilities, NodeRecord, NodeStatus, Role

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
        accelerator = torch.cuda.get_device_name(0)
    return Capabilities(
        cpu_count=os.cpu_count() or 1, memory_bytes=psutil.virtual_memory().total, accelerator=accelerator
    )


def fetch_run_records(dht: hivemind.DHT, run_id: str, now: float | None = None) -> dict[bytes, LiveNode]:
    """Every verified record under the run's node-records key, by PeerID, including LEFT ones.

    Values were already checked by the DHT's record validator; they are verified again here
    because a local cache or a future validator change must never let a forged record through.
    """
    key = node_records_key(run_id)
    found = dht.get(key, latest=True)
    now = time.time() if now is None else now
    records: dict[bytes, LiveNode] = {}
    if found is None or not isinstance(found.value, dict):
        return records
    for subkey, item in found.value.items():
        if not (isinstance(subkey, str) and subkey.startswith(SIGNED_SUBKEY_PREFIX)):
            continue
        try:
            signer = PeerID.from_base58(subkey[len(SIGNED_SUBKEY_PREFIX) :]).to_bytes()
            envelope = open_envelope(
                item.value,
                domain=NODE_RECORD_DOMAIN,
                run_id=run_id,
                dht_key=key,
                signer=signer,
                max_ttl_s=MAX_NODE_RECORD_TTL_S,
                now=now,
            )
            record = NodeRecord.from_payload(envelope.payload)
        except (InvalidMessage, ValueError) as exc:
            logger.info("ignoring invalid node record under %s: %s", subkey, exc)
            continue
        if record.peer_id != signer or envelope.expires_at < now:
            continue
        records[signer] = LiveNode(record=record, expires_at=envelope.expires_at, seq=envelope.seq)
    return records


def discover(dht: hivemind.DHT, run_id: str, role: Role | None = None) -> list[LiveNode]:
    """The live nodes of `run_id` (optionally only those with `role`), oldest first."""
    nodes = [
        node
        for node in fetch_run_records(dht, run_id).values()
        if node.record.status == NodeStatus.ONLINE and (role is None or role in node.record.roles)
    ]
    return sorted(nodes, key=lambda node: node.record.started_at)


class Membership:
    """Publishes and refreshes this node's record in a background thread; `leave` withdraws it."""

    def __init__(
        self,
        dht: hivemind.DHT,
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
    ):
        self.dht = dht
        self.identity = identity
        self.run_id = run_id
        self.record_ttl_s = record_ttl_s
        self.refresh_interval_s = refresh_interval_s
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
        self._seq = time.time_ns()  # strictly increasing across restarts too
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_publish_ok = False

    def check_identity_free(self) -> None:
        """Refuse to run if another live process (anywhere) publishes records with this identity.

        A record from another instance may be the stale leftover of a crashed process, so we
        wait one refresh interval and only refuse if that instance refreshed it meanwhile.
        """
        me = self.identity.peer_id_bytes
        first = fetch_run_records(self.dht, self.run_id).get(me)
        if first is None or first.record.instance_id == self.record.instance_id:
            return
        if first.record.status == NodeStatus.LEFT:
            return
        deadline = time.monotonic() + self.refresh_interval_s * 1.5 + 1.0
        while time.monotonic() < deadline:
            time.sleep(min(1.0, self.refresh_interval_s / 4))
            later = fetch_run_records(self.dht, self.run_id).get(me)
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

    def publish(self, status: NodeStatus = NodeStatus.ONLINE) -> bool:
        """Sign and store the current record; return whether at least one DHT peer accepted it."""
        self._seq = max(self._seq + 1, time.time_ns())
        if status != self.record.status:
            self.record = self.record.model_copy(update={"status": status})
        key = node_records_key(self.run_id)
        expires_at = time.time() + self.record_ttl_s
        value = seal(
            self.identity.private_key,
            domain=NODE_RECORD_DOMAIN,
            run_id=self.run_id,
            dht_key=key,
            expires_at=expires_at,
            seq=self._seq,
            payload=self.record.to_payload(),
        )
        subkey = signed_subkey(self.identity.peer_id.to_base58())
        ok = bool(self.dht.store(key, value, expiration_time=expires_at, subkey=subkey))
        self.last_publish_ok = ok
        if not ok:
            logger.warning("node record was not stored by any DHT peer; will retry")
        return ok

    def start(self) -> None:
        """Publish now and keep refreshing in the background."""
        self.publish()
        self._thread = threading.Thread(target=self._refresh_loop, name="membership-refresh", daemon=True)
        self._thread.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_interval_s if self.last_publish_ok else 1.0):
            try:
                self.publish()
            except Exception as exc:  # the DHT may be shutting down; keep the node alive regardless
                logger.warning("refreshing node record failed: %r", exc)

    def leave(self) -> None:
        """Stop refreshing and publish a LEFT record so that discovery drops this node at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.publish(NodeStatus.LEFT)
        except Exception as exc:
            logger.warning("could not withdraw node record: %r", exc)
