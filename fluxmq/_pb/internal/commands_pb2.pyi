from fluxmq._pb.v1 import queue_pb2 as _queue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateQueueCmd(_message.Message):
    __slots__ = ("config", "now_ms")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    config: _queue_pb2.QueueConfig
    now_ms: int
    def __init__(self, config: _Optional[_Union[_queue_pb2.QueueConfig, _Mapping]] = ..., now_ms: _Optional[int] = ...) -> None: ...

class UpdateQueueCmd(_message.Message):
    __slots__ = ("config", "now_ms", "queue_id", "expected_updated_at_ms")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    config: _queue_pb2.QueueConfig
    now_ms: int
    queue_id: int
    expected_updated_at_ms: int
    def __init__(self, config: _Optional[_Union[_queue_pb2.QueueConfig, _Mapping]] = ..., now_ms: _Optional[int] = ..., queue_id: _Optional[int] = ..., expected_updated_at_ms: _Optional[int] = ...) -> None: ...

class DeleteQueueCmd(_message.Message):
    __slots__ = ("name", "now_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    now_ms: int
    def __init__(self, name: _Optional[str] = ..., now_ms: _Optional[int] = ...) -> None: ...

class AppendCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "now_ms", "records", "partitions", "idempotency_keys")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    now_ms: int
    records: _containers.RepeatedScalarFieldContainer[bytes]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    idempotency_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., now_ms: _Optional[int] = ..., records: _Optional[_Iterable[bytes]] = ..., partitions: _Optional[_Iterable[int]] = ..., idempotency_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class PurgeCmd(_message.Message):
    __slots__ = ("name", "queue_id", "now_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_id: int
    now_ms: int
    def __init__(self, name: _Optional[str] = ..., queue_id: _Optional[int] = ..., now_ms: _Optional[int] = ...) -> None: ...

class ApplyRetentionCmd(_message.Message):
    __slots__ = ("now_ms",)
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    now_ms: int
    def __init__(self, now_ms: _Optional[int] = ...) -> None: ...
