from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SeedService(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEED_SERVICE_UNSPECIFIED: _ClassVar[SeedService]
    SEED_SERVICE_BOOTSTRAP: _ClassVar[SeedService]
    SEED_SERVICE_DIAL_BACK: _ClassVar[SeedService]
SEED_SERVICE_UNSPECIFIED: SeedService
SEED_SERVICE_BOOTSTRAP: SeedService
SEED_SERVICE_DIAL_BACK: SeedService

class TrainingReceipt(_message.Message):
    __slots__ = ("contributor", "outer_step", "round_id", "tokens_trained", "bytes_exchanged", "issued_at", "signer_loss")
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    BYTES_EXCHANGED_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNER_LOSS_FIELD_NUMBER: _ClassVar[int]
    contributor: bytes
    outer_step: int
    round_id: bytes
    tokens_trained: int
    bytes_exchanged: int
    issued_at: float
    signer_loss: float
    def __init__(self, contributor: _Optional[bytes] = ..., outer_step: _Optional[int] = ..., round_id: _Optional[bytes] = ..., tokens_trained: _Optional[int] = ..., bytes_exchanged: _Optional[int] = ..., issued_at: _Optional[float] = ..., signer_loss: _Optional[float] = ...) -> None: ...

class TransferReceipt(_message.Message):
    __slots__ = ("contributor", "version", "manifest_hash", "chunks", "byte_count", "issued_at")
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    contributor: bytes
    version: int
    manifest_hash: bytes
    chunks: int
    byte_count: int
    issued_at: float
    def __init__(self, contributor: _Optional[bytes] = ..., version: _Optional[int] = ..., manifest_hash: _Optional[bytes] = ..., chunks: _Optional[int] = ..., byte_count: _Optional[int] = ..., issued_at: _Optional[float] = ...) -> None: ...

class SeedServiceReceipt(_message.Message):
    __slots__ = ("contributor", "service", "session_id", "count", "issued_at")
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    contributor: bytes
    service: SeedService
    session_id: bytes
    count: int
    issued_at: float
    def __init__(self, contributor: _Optional[bytes] = ..., service: _Optional[_Union[SeedService, str]] = ..., session_id: _Optional[bytes] = ..., count: _Optional[int] = ..., issued_at: _Optional[float] = ...) -> None: ...

class ValidationReceipt(_message.Message):
    __slots__ = ("contributor", "group_hash", "rollouts", "tokens", "issued_at")
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    GROUP_HASH_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    contributor: bytes
    group_hash: bytes
    rollouts: int
    tokens: int
    issued_at: float
    def __init__(self, contributor: _Optional[bytes] = ..., group_hash: _Optional[bytes] = ..., rollouts: _Optional[int] = ..., tokens: _Optional[int] = ..., issued_at: _Optional[float] = ...) -> None: ...
