"""Node records: what a node announces about itself in the DHT, as a strict typed object.

`NodeRecord.from_payload` is the only way untrusted bytes become a record; it checks every
field's type, size and shape and raises InvalidMessage otherwise.
"""

from __future__ import annotations

import enum
from typing import Annotated

from multiaddr import Multiaddr
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol import hivenet_pb2 as pb
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_ADDRESS_CHARS,
    MAX_ADDRESSES,
    MAX_ATTESTATION_BYTES,
    MAX_ATTESTATIONS,
    MAX_PUBLIC_NAME_CHARS,
    MAX_ROLES,
    MAX_RUN_ID_CHARS,
)
from protocol.text import NAME_PATTERN, VERSION_PATTERN
from protocol.untrusted import parse_untrusted

NODE_RECORD_DOMAIN = "node-record"


class Role(enum.StrEnum):
    """What a node does in the swarm."""

    SEED = "seed"
    TRAINER = "trainer"
    INFERENCE = "inference"
    VALIDATOR = "validator"
    RELAY = "relay"


class NodeStatus(enum.IntEnum):
    """Whether the node is up or has announced a clean leave."""

    ONLINE = pb.NODE_STATUS_ONLINE
    LEFT = pb.NODE_STATUS_LEFT


class Reachability(enum.IntEnum):
    """What the node's own dial-back check found: self-reported, for people to read, never relied on."""

    UNKNOWN = pb.REACHABILITY_UNKNOWN
    PUBLIC = pb.REACHABILITY_PUBLIC
    PRIVATE = pb.REACHABILITY_PRIVATE


class Capabilities(BaseModel):
    """Hardware a node offers."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    cpu_count: int = Field(ge=0, le=1 << 16)
    """Logical CPU cores."""
    memory_bytes: int = Field(ge=0, le=1 << 50)
    """Total RAM in bytes."""
    accelerator: str = Field(default="", max_length=128, pattern=NAME_PATTERN.pattern)
    """Accelerator name, e.g. 'NVIDIA H100'; empty when there is none."""


class NodeRecord(BaseModel):
    """A node's signed self-description, as published under the run's node-records key."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    peer_id: bytes = Field(min_length=2, max_length=64)
    """The node's libp2p PeerID bytes (must equal the signer's)."""
    roles: tuple[Role, ...] = Field(min_length=1, max_length=MAX_ROLES)
    """What the node does; at least one role."""
    public_name: str = Field(max_length=MAX_PUBLIC_NAME_CHARS)
    """Name shown on the dashboard and leaderboard."""
    run_id: str = Field(min_length=1, max_length=MAX_RUN_ID_CHARS)
    """The training run the node takes part in."""
    software_version: str = Field(min_length=1, max_length=32, pattern=VERSION_PATTERN.pattern)
    """hivenet version the node runs."""
    protocol_version: int = Field(ge=0, le=1 << 16)
    """Wire protocol version."""
    capabilities: Capabilities
    """Hardware on offer."""
    addresses: tuple[Annotated[str, Field(max_length=MAX_ADDRESS_CHARS)], ...] = Field(
        max_length=MAX_ADDRESSES
    )
    """Multiaddrs the node can be reached at."""
    started_at: float = Field(ge=0, allow_inf_nan=False)
    """Unix time at which the node process started."""
    instance_id: bytes = Field(min_length=8, max_length=32)
    """Random per process; two processes with one identity have different ones."""
    status: NodeStatus = NodeStatus.ONLINE
    """ONLINE while alive, LEFT after a clean leave."""
    reachability: Reachability = Reachability.UNKNOWN
    """What its own dial-back check through a seed found (self-reported)."""
    attestations: tuple[Annotated[bytes, Field(max_length=MAX_ATTESTATION_BYTES)], ...] = Field(
        default=(), max_length=MAX_ATTESTATIONS
    )
    """Sealed address attestations from its seeds (`protocol.address_attestation`), unverified here:
    whoever dials one of `addresses` verifies them."""

    @field_validator("public_name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if not NAME_PATTERN.match(value):
            raise ValueError("public name may hold letters, digits, spaces and .,:@()+-_ only")
        return value

    @field_validator("addresses")
    @classmethod
    def _parse_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            try:
                Multiaddr(address)
            except Exception as exc:
                raise ValueError(f"invalid multiaddr {address!r}: {exc}") from None
        return value

    def to_payload(self) -> bytes:
        """Serialize to the protobuf payload carried in a signed envelope."""
        return pb.NodeRecord(
            peer_id=self.peer_id,
            roles=[role.value for role in self.roles],
            public_name=self.public_name,
            run_id=self.run_id,
            software_version=self.software_version,
            protocol_version=self.protocol_version,
            capabilities=pb.Capabilities(
                cpu_count=self.capabilities.cpu_count,
                memory_bytes=self.capabilities.memory_bytes,
                accelerator=self.capabilities.accelerator,
            ),
            addresses=list(self.addresses),
            started_at=self.started_at,
            instance_id=self.instance_id,
            status=int(self.status),  # type: ignore[arg-type]
            reachability=int(self.reachability),  # type: ignore[arg-type]
            attestations=list(self.attestations),
        ).SerializeToString()

    @classmethod
    def from_payload(cls, payload: bytes) -> NodeRecord:
        """Parse and validate an untrusted payload; raise InvalidMessage with the reason if it is bad."""
        message = parse_untrusted(pb.NodeRecord, payload, "node record")
        try:
            return cls(
                peer_id=message.peer_id,
                roles=tuple(Role(role) for role in message.roles),
                public_name=message.public_name,
                run_id=message.run_id,
                software_version=message.software_version,
                protocol_version=message.protocol_version,
                capabilities=Capabilities(
                    cpu_count=message.capabilities.cpu_count,
                    memory_bytes=message.capabilities.memory_bytes,
                    accelerator=message.capabilities.accelerator,
                ),
                addresses=tuple(message.addresses),
                started_at=message.started_at,
                instance_id=message.instance_id,
                status=NodeStatus(message.status),
                reachability=Reachability(message.reachability),
                attestations=tuple(message.attestations),
            )
        except (ValidationError, ValueError) as exc:
            raise InvalidMessage(f"invalid node record: {exc}") from None
