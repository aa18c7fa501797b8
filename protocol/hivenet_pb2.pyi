from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_ONLINE: _ClassVar[NodeStatus]
    NODE_STATUS_LEFT: _ClassVar[NodeStatus]

class Reachability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REACHABILITY_UNKNOWN: _ClassVar[Reachability]
    REACHABILITY_PUBLIC: _ClassVar[Reachability]
    REACHABILITY_PRIVATE: _ClassVar[Reachability]

class DialBackCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIAL_BACK_UNSPECIFIED: _ClassVar[DialBackCode]
    DIAL_BACK_REACHABLE: _ClassVar[DialBackCode]
    DIAL_BACK_UNREACHABLE: _ClassVar[DialBackCode]
    DIAL_BACK_BAD_REQUEST: _ClassVar[DialBackCode]
    DIAL_BACK_RATE_LIMITED: _ClassVar[DialBackCode]
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_ONLINE: NodeStatus
NODE_STATUS_LEFT: NodeStatus
REACHABILITY_UNKNOWN: Reachability
REACHABILITY_PUBLIC: Reachability
REACHABILITY_PRIVATE: Reachability
DIAL_BACK_UNSPECIFIED: DialBackCode
DIAL_BACK_REACHABLE: DialBackCode
DIAL_BACK_UNREACHABLE: DialBackCode
DIAL_BACK_BAD_REQUEST: DialBackCode
DIAL_BACK_RATE_LIMITED: DialBackCode

class EnvelopeBody(_message.Message):
    __slots__ = ("domain", "protocol_version", "run_id", "dht_key", "expires_at", "seq", "signer", "payload")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DHT_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    domain: str
    protocol_version: int
    run_id: str
    dht_key: str
    expires_at: float
    seq: int
    signer: bytes
    payload: bytes
    def __init__(self, domain: _Optional[str] = ..., protocol_version: _Optional[int] = ..., run_id: _Optional[str] = ..., dht_key: _Optional[str] = ..., expires_at: _Optional[float] = ..., seq: _Optional[int] = ..., signer: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...

class SignedEnvelope(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("cpu_count", "memory_bytes", "accelerator")
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    cpu_count: int
    memory_bytes: int
    accelerator: str
    def __init__(self, cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., accelerator: _Optional[str] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("peer_id", "roles", "public_name", "run_id", "software_version", "protocol_version", "capabilities", "addresses", "started_at", "instance_id", "status", "reachability", "attestations")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    ATTESTATIONS_FIELD_NUMBER: _ClassVar[int]
    peer_id: bytes
    roles: _containers.RepeatedScalarFieldContainer[str]
    public_name: str
    run_id: str
    software_version: str
    protocol_version: int
    capabilities: Capabilities
    addresses: _containers.RepeatedScalarFieldContainer[str]
    started_at: float
    instance_id: bytes
    status: NodeStatus
    reachability: Reachability
    attestations: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, peer_id: _Optional[bytes] = ..., roles: _Optional[_Iterable[str]] = ..., public_name: _Optional[str] = ..., run_id: _Optional[str] = ..., software_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., addresses: _Optional[_Iterable[str]] = ..., started_at: _Optional[float] = ..., instance_id: _Optional[bytes] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., reachability: _Optional[_Union[Reachability, str]] = ..., attestations: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("addresses",)
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class DialBackResponse(_message.Message):
    __slots__ = ("code", "detail", "attestation")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_FIELD_NUMBER: _ClassVar[int]
    code: DialBackCode
    detail: str
    attestation: bytes
    def __init__(self, code: _Optional[_Union[DialBackCode, str]] = ..., detail: _Optional[str] = ..., attestation: _Optional[bytes] = ...) -> None: ...

class AddressAttestation(_message.Message):
    __slots__ = ("subject", "addresses", "issued_at")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    subject: bytes
    addresses: _containers.RepeatedScalarFieldContainer[str]
    issued_at: float
    def __init__(self, subject: _Optional[bytes] = ..., addresses: _Optional[_Iterable[str]] = ..., issued_at: _Optional[float] = ...) -> None: ...
