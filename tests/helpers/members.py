"""A live member of a run as membership would list it, for tests that dial or pull from one."""

from __future__ import annotations

from node.membership import LiveNode
from protocol.node_record import Capabilities, NodeRecord, Role


def live_member(
    peer_id: bytes, addresses: tuple[str, ...] = (), *, run_id: str = "run", name: str = ""
) -> LiveNode:
    """A validator's signed-record view: `peer_id` listening on `addresses` (nothing checks them)."""
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
    )
    return LiveNode(record=record, expires_at=0.0, seq=1)
