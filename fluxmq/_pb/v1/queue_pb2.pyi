from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUE_TYPE_UNSPECIFIED: _ClassVar[QueueType]
    QUEUE_TYPE_STREAM: _ClassVar[QueueType]
    QUEUE_TYPE_WORK: _ClassVar[QueueType]
QUEUE_TYPE_UNSPECIFIED: QueueType
QUEUE_TYPE_STREAM: QueueType
QUEUE_TYPE_WORK: QueueType

class Retention(_message.Message):
    __slots__ = ("max_age", "max_messages", "max_bytes")
    MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_age: str
    max_messages: int
    max_bytes: str
    def __init__(self, max_age: _Optional[str] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[str] = ...) -> None: ...

class QueueConfig(_message.Message):
    __slots__ = ("name", "partitions", "type", "retention", "dedup_window", "max_message_bytes", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    type: QueueType
    retention: Retention
    dedup_window: str
    max_message_bytes: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., type: _Optional[_Union[QueueType, str]] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., dedup_window: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("config", "queue_id", "created_at_ms", "updated_at_ms")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    config: QueueConfig
    queue_id: int
    created_at_ms: int
    updated_at_ms: int
    def __init__(self, config: _Optional[_Union[QueueConfig, _Mapping]] = ..., queue_id: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: QueueConfig
    def __init__(self, config: _Optional[_Union[QueueConfig, _Mapping]] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("config", "update_mask")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    config: QueueConfig
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, config: _Optional[_Union[QueueConfig, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("prefix", "label_selector", "page_token", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    label_selector: str
    page_token: str
    limit: int
    def __init__(self, prefix: _Optional[str] = ..., label_selector: _Optional[str] = ..., page_token: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    next_page_token: str
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("purged_messages",)
    PURGED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    purged_messages: int
    def __init__(self, purged_messages: _Optional[int] = ...) -> None: ...

class GetQueueStatsRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PartitionStats(_message.Message):
    __slots__ = ("partition", "low_watermark", "high_watermark", "messages", "bytes")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    low_watermark: int
    high_watermark: int
    messages: int
    bytes: int
    def __init__(self, partition: _Optional[int] = ..., low_watermark: _Optional[int] = ..., high_watermark: _Optional[int] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("name", "partitions", "messages", "bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStats]
    messages: int
    bytes: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionStats, _Mapping]]] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class PublishMessage(_message.Message):
    __slots__ = ("key", "value", "headers", "partition", "idempotency_key")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    partition: int
    idempotency_key: str
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ..., partition: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("queue", "messages", "request_timeout_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    messages: _containers.RepeatedCompositeFieldContainer[PublishMessage]
    request_timeout_ms: int
    def __init__(self, queue: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[PublishMessage, _Mapping]]] = ..., request_timeout_ms: _Optional[int] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("partition", "offset", "timestamp_ms", "duplicate")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ...) -> None: ...

class PublishStreamRequest(_message.Message):
    __slots__ = ("sequence", "publish")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    publish: PublishRequest
    def __init__(self, sequence: _Optional[int] = ..., publish: _Optional[_Union[PublishRequest, _Mapping]] = ...) -> None: ...

class PublishStreamResponse(_message.Message):
    __slots__ = ("sequence", "results", "error")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    error: RequestError
    def __init__(self, sequence: _Optional[int] = ..., results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ..., error: _Optional[_Union[RequestError, _Mapping]] = ...) -> None: ...

class RequestError(_message.Message):
    __slots__ = ("code", "message", "reason", "status_details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    status_details: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., status_details: _Optional[bytes] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("partition", "offset", "timestamp_ms", "key", "value", "headers", "idempotency_key")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    idempotency_key: str
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("queue", "partition", "offset", "max_messages", "max_bytes", "wait_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partition: int
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int
    def __init__(self, queue: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("records", "next_offset", "high_watermark", "low_watermark")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    next_offset: int
    high_watermark: int
    low_watermark: int
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., low_watermark: _Optional[int] = ...) -> None: ...

class StartPosition(_message.Message):
    __slots__ = ("earliest", "latest", "offset", "timestamp_ms")
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    earliest: bool
    latest: bool
    offset: int
    timestamp_ms: int
    def __init__(self, earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class TailRequest(_message.Message):
    __slots__ = ("queue", "partitions", "start", "max_messages")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    start: StartPosition
    max_messages: int
    def __init__(self, queue: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., start: _Optional[_Union[StartPosition, _Mapping]] = ..., max_messages: _Optional[int] = ...) -> None: ...

class TailResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class SeekToTimestampRequest(_message.Message):
    __slots__ = ("queue", "partition", "timestamp_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partition: int
    timestamp_ms: int
    def __init__(self, queue: _Optional[str] = ..., partition: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class SeekToTimestampResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...
