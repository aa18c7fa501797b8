from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_OK: _ClassVar[Status]
    STATUS_NOT_FOUND: _ClassVar[Status]
    STATUS_BAD_REQUEST: _ClassVar[Status]
    STATUS_BUSY: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
STATUS_OK: Status
STATUS_NOT_FOUND: Status
STATUS_BAD_REQUEST: Status
STATUS_BUSY: Status

class TensorLayout(_message.Message):
    __slots__ = ("name", "dtype", "shape", "begin_bytes", "end_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    END_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    begin_bytes: int
    end_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., begin_bytes: _Optional[int] = ..., end_bytes: _Optional[int] = ...) -> None: ...

class ManifestBody(_message.Message):
    __slots__ = ("protocol_version", "run_id", "version", "publisher", "created_at", "total_bytes", "chunk_bytes", "chunk_hashes", "tensors")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    run_id: str
    version: int
    publisher: bytes
    created_at: float
    total_bytes: int
    chunk_bytes: int
    chunk_hashes: bytes
    tensors: _containers.RepeatedCompositeFieldContainer[TensorLayout]
    def __init__(self, protocol_version: _Optional[int] = ..., run_id: _Optional[str] = ..., version: _Optional[int] = ..., publisher: _Optional[bytes] = ..., created_at: _Optional[float] = ..., total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_hashes: _Optional[bytes] = ..., tensors: _Optional[_Iterable[_Union[TensorLayout, _Mapping]]] = ...) -> None: ...

class SignedManifest(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class WeightsPointer(_message.Message):
    __slots__ = ("run_id", "version", "content_id", "manifest_bytes", "num_chunks", "total_bytes", "publisher")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    content_id: bytes
    manifest_bytes: int
    num_chunks: int
    total_bytes: int
    publisher: bytes
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., content_id: _Optional[bytes] = ..., manifest_bytes: _Optional[int] = ..., num_chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., publisher: _Optional[bytes] = ...) -> None: ...

class HolderAnnouncement(_message.Message):
    __slots__ = ("run_id", "version", "content_id", "chunks_held", "num_chunks", "addresses", "attestations")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_HELD_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ATTESTATIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    content_id: bytes
    chunks_held: int
    num_chunks: int
    addresses: _containers.RepeatedScalarFieldContainer[str]
    attestations: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., content_id: _Optional[bytes] = ..., chunks_held: _Optional[int] = ..., num_chunks: _Optional[int] = ..., addresses: _Optional[_Iterable[str]] = ..., attestations: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("run_id", "version", "content_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    content_id: bytes
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., content_id: _Optional[bytes] = ...) -> None: ...

class ChunkRequest(_message.Message):
    __slots__ = ("run_id", "version", "content_id", "index")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    content_id: bytes
    index: int
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., content_id: _Optional[bytes] = ..., index: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("run_id", "version", "content_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    content_id: bytes
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., content_id: _Optional[bytes] = ...) -> None: ...

class ResponseHeader(_message.Message):
    __slots__ = ("status", "payload_bytes", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: Status
    payload_bytes: int
    detail: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., payload_bytes: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class HaveUpdate(_message.Message):
    __slots__ = ("bitmap", "new_chunks", "dropped", "fetching")
    BITMAP_FIELD_NUMBER: _ClassVar[int]
    NEW_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    FETCHING_FIELD_NUMBER: _ClassVar[int]
    bitmap: bytes
    new_chunks: _containers.RepeatedScalarFieldContainer[int]
    dropped: bool
    fetching: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, bitmap: _Optional[bytes] = ..., new_chunks: _Optional[_Iterable[int]] = ..., dropped: _Optional[bool] = ..., fetching: _Optional[_Iterable[int]] = ...) -> None: ...
