"""Members of a run for tests: a live member as membership would list it (for tests that dial or
pull from one), and a validator's membership that publishes a real record."""

from __future__ import annotations

from typing import Any

from node.identity import Identity
from node.membership import LiveNode, Membership
from protocol.node_record import Capabilities, NodeRecord, Role
from protocol.version import PROTOCOL_VERSION


def validator_membership(
    dht: Any, identity: Identity, run_id: str, *, public_name: str = "", record_ttl_s: float = 60.0
) -> Membership:
    """The membership of a validator of `run_id` on `dht`, published by hand (`publish`)."""
    return Membership(
        dht,
        identity,
        run_id=run_id,
        roles=[Role.VALIDATOR],
        public_name=public_name,
        addresses=[],
        record_ttl_s=record_ttl_s,
        refresh_interval_s=record_ttl_s / 3,
        software_version="test",
        protocol_version=PROTOCOL_VERSION,
        check_identity=False,
    )


def live_member(
    peer_id: bytes,
    addresses: tuple[str, ...] = (),
    *,
    run_id: str = "run",
    name: str = "",
    attestations: tuple[bytes, ...] = (),
) -> LiveNode:
    """A validator's signed-record view: `peer_id` listening on `addresses`, with the sealed address
    `attestations` its record carries (nothing checks them here)."""
    record = NodeRecord(
        peer_id=peer_id,
        roles=(Role.VALIDATOR,),
        public_name=name,
        run_id=run_id,
        software_version="0.1.0",
        protocol_version=1,
        capabilities=Capabilities(cpu_count=1, memory_bytes=1 << 30, accelerator=""),
        addresses=addresses,
        started_at=0.0,
        instance_id=b"\x01" * 16,
        attestations=attestations,
    )
    return LiveNode(record=record, expires_at=0.0, seq=1)
