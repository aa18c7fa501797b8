from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutForward(_message.Message):
    __slots__ = ("group", "verdicts")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    group: bytes
    verdicts: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, group: _Optional[bytes] = ..., verdicts: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ("error", "receipt")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    error: str
    receipt: bytes
    def __init__(self, error: _Optional[str] = ..., receipt: _Optional[bytes] = ...) -> None: ...
