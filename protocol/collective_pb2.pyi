from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoundDeclaration(_message.Message):
    __slots__ = ("step", "outer_hash", "codec", "gather_at", "serves_state", "final")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTER_HASH_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    GATHER_AT_FIELD_NUMBER: _ClassVar[int]
    SERVES_STATE_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    step: int
    outer_hash: str
    codec: str
    gather_at: float
    serves_state: bool
    final: bool
    def __init__(self, step: _Optional[int] = ..., outer_hash: _Optional[str] = ..., codec: _Optional[str] = ..., gather_at: _Optional[float] = ..., serves_state: _Optional[bool] = ..., final: _Optional[bool] = ...) -> None: ...

class ContributionHeader(_message.Message):
    __slots__ = ("step", "outer_hash", "codec", "payload_sha256", "payload_bytes")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTER_HASH_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    step: int
    outer_hash: str
    codec: str
    payload_sha256: bytes
    payload_bytes: int
    def __init__(self, step: _Optional[int] = ..., outer_hash: _Optional[str] = ..., codec: _Optional[str] = ..., payload_sha256: _Optional[bytes] = ..., payload_bytes: _Optional[int] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("header", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: bytes
    payload: bytes
    def __init__(self, header: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Held(_message.Message):
    __slots__ = ("peer", "payload_sha256")
    PEER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    payload_sha256: bytes
    def __init__(self, peer: _Optional[bytes] = ..., payload_sha256: _Optional[bytes] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("step", "held")
    STEP_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    step: int
    held: _containers.RepeatedCompositeFieldContainer[Held]
    def __init__(self, step: _Optional[int] = ..., held: _Optional[_Iterable[_Union[Held, _Mapping]]] = ...) -> None: ...

class RoundMessage(_message.Message):
    __slots__ = ("contribution", "commit")
    CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    contribution: Contribution
    commit: bytes
    def __init__(self, contribution: _Optional[_Union[Contribution, _Mapping]] = ..., commit: _Optional[bytes] = ...) -> None: ...

class RoundReply(_message.Message):
    __slots__ = ("error", "contribution", "commit")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    error: str
    contribution: Contribution
    commit: bytes
    def __init__(self, error: _Optional[str] = ..., contribution: _Optional[_Union[Contribution, _Mapping]] = ..., commit: _Optional[bytes] = ...) -> None: ...
