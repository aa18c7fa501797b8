from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Rollout(_message.Message):
    __slots__ = ("prompt_ids", "completion_ids", "dtype", "temperature", "top_p", "seed", "proofs", "device")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PROOFS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    temperature: float
    top_p: float
    seed: int
    proofs: _containers.RepeatedScalarFieldContainer[bytes]
    device: str
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., completion_ids: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., proofs: _Optional[_Iterable[bytes]] = ..., device: _Optional[str] = ...) -> None: ...

class RolloutGroup(_message.Message):
    __slots__ = ("policy_version", "counter", "task", "rollouts")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    counter: int
    task: str
    rollouts: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, policy_version: _Optional[int] = ..., counter: _Optional[int] = ..., task: _Optional[str] = ..., rollouts: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("verdicts", "error")
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedScalarFieldContainer[bytes]
    error: str
    def __init__(self, verdicts: _Optional[_Iterable[bytes]] = ..., error: _Optional[str] = ...) -> None: ...

class RolloutVerdict(_message.Message):
    __slots__ = ("worker", "rollout_hash", "policy_version", "counter", "index", "tokens", "accepted", "reason", "detail", "reward", "issued_at", "banned_until")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_HASH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    BANNED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    worker: bytes
    rollout_hash: bytes
    policy_version: int
    counter: int
    index: int
    tokens: int
    accepted: bool
    reason: str
    detail: str
    reward: float
    issued_at: float
    banned_until: float
    def __init__(self, worker: _Optional[bytes] = ..., rollout_hash: _Optional[bytes] = ..., policy_version: _Optional[int] = ..., counter: _Optional[int] = ..., index: _Optional[int] = ..., tokens: _Optional[int] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., reward: _Optional[float] = ..., issued_at: _Optional[float] = ..., banned_until: _Optional[float] = ...) -> None: ...

class TicketRequest(_message.Message):
    __slots__ = ("run_id", "count", "policy_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    count: int
    policy_version: int
    def __init__(self, run_id: _Optional[str] = ..., count: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class Ticket(_message.Message):
    __slots__ = ("counter", "policy_version", "nonce")
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    counter: int
    policy_version: int
    nonce: bytes
    def __init__(self, counter: _Optional[int] = ..., policy_version: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class TicketResponse(_message.Message):
    __slots__ = ("tickets", "error")
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    tickets: _containers.RepeatedCompositeFieldContainer[Ticket]
    error: str
    def __init__(self, tickets: _Optional[_Iterable[_Union[Ticket, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...
