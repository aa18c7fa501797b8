from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReceiptsRequest(_message.Message):
    __slots__ = ("run_id", "after", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after: int
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., after: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReceiptsResponse(_message.Message):
    __slots__ = ("receipts", "next", "more", "error")
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    receipts: _containers.RepeatedScalarFieldContainer[bytes]
    next: int
    more: bool
    error: str
    def __init__(self, receipts: _Optional[_Iterable[bytes]] = ..., next: _Optional[int] = ..., more: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...
