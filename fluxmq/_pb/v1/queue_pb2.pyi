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

class ReplicationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICATION_MODE_UNSPECIFIED: _ClassVar[ReplicationMode]
    REPLICATION_MODE_SYNC: _ClassVar[ReplicationMode]
    REPLICATION_MODE_ASYNC: _ClassVar[ReplicationMode]

class PurgeScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURGE_SCOPE_UNSPECIFIED: _ClassVar[PurgeScope]
    PURGE_SCOPE_READY: _ClassVar[PurgeScope]
    PURGE_SCOPE_SCHEDULED: _ClassVar[PurgeScope]
    PURGE_SCOPE_ALL: _ClassVar[PurgeScope]

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    DELIVERY_MODE_SHARED: _ClassVar[DeliveryMode]
    DELIVERY_MODE_ORDERED: _ClassVar[DeliveryMode]

class ReceiptStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECEIPT_STATUS_UNSPECIFIED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_ACKED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_ALREADY_ACKED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_UNKNOWN: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_STALE: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_NACKED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_DEAD_LETTERED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_EXTENDED: _ClassVar[ReceiptStatus]
QUEUE_TYPE_UNSPECIFIED: QueueType
QUEUE_TYPE_STREAM: QueueType
QUEUE_TYPE_WORK: QueueType
REPLICATION_MODE_UNSPECIFIED: ReplicationMode
REPLICATION_MODE_SYNC: ReplicationMode
REPLICATION_MODE_ASYNC: ReplicationMode
PURGE_SCOPE_UNSPECIFIED: PurgeScope
PURGE_SCOPE_READY: PurgeScope
PURGE_SCOPE_SCHEDULED: PurgeScope
PURGE_SCOPE_ALL: PurgeScope
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
DELIVERY_MODE_SHARED: DeliveryMode
DELIVERY_MODE_ORDERED: DeliveryMode
RECEIPT_STATUS_UNSPECIFIED: ReceiptStatus
RECEIPT_STATUS_ACKED: ReceiptStatus
RECEIPT_STATUS_ALREADY_ACKED: ReceiptStatus
RECEIPT_STATUS_UNKNOWN: ReceiptStatus
RECEIPT_STATUS_STALE: ReceiptStatus
RECEIPT_STATUS_NACKED: ReceiptStatus
RECEIPT_STATUS_DEAD_LETTERED: ReceiptStatus
RECEIPT_STATUS_EXTENDED: ReceiptStatus

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
    __slots__ = ("name", "partitions", "type", "retention", "dedup_window", "max_message_bytes", "labels", "lease_timeout", "max_attempts", "retry_backoff", "message_ttl", "delivery_delay", "dead_letter_queue", "dead_letter_disabled", "retain_until_consumed", "dead_letter_alert_threshold", "replication", "environment")
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
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TTL_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_DELAY_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_DISABLED_FIELD_NUMBER: _ClassVar[int]
    RETAIN_UNTIL_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_ALERT_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    type: QueueType
    retention: Retention
    dedup_window: str
    max_message_bytes: int
    labels: _containers.ScalarMap[str, str]
    lease_timeout: str
    max_attempts: int
    retry_backoff: RetryBackoff
    message_ttl: str
    delivery_delay: str
    dead_letter_queue: str
    dead_letter_disabled: bool
    retain_until_consumed: bool
    dead_letter_alert_threshold: int
    replication: Replication
    environment: str
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., type: _Optional[_Union[QueueType, str]] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., dedup_window: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., lease_timeout: _Optional[str] = ..., max_attempts: _Optional[int] = ..., retry_backoff: _Optional[_Union[RetryBackoff, _Mapping]] = ..., message_ttl: _Optional[str] = ..., delivery_delay: _Optional[str] = ..., dead_letter_queue: _Optional[str] = ..., dead_letter_disabled: _Optional[bool] = ..., retain_until_consumed: _Optional[bool] = ..., dead_letter_alert_threshold: _Optional[int] = ..., replication: _Optional[_Union[Replication, _Mapping]] = ..., environment: _Optional[str] = ...) -> None: ...

class Replication(_message.Message):
    __slots__ = ("factor", "min_in_sync", "mode", "ack_timeout", "group")
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    factor: int
    min_in_sync: int
    mode: ReplicationMode
    ack_timeout: str
    group: str
    def __init__(self, factor: _Optional[int] = ..., min_in_sync: _Optional[int] = ..., mode: _Optional[_Union[ReplicationMode, str]] = ..., ack_timeout: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class RetryBackoff(_message.Message):
    __slots__ = ("base", "max")
    BASE_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    base: str
    max: str
    def __init__(self, base: _Optional[str] = ..., max: _Optional[str] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("config", "queue_id", "created_at_ms", "updated_at_ms", "dead_letter_of")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_OF_FIELD_NUMBER: _ClassVar[int]
    config: QueueConfig
    queue_id: int
    created_at_ms: int
    updated_at_ms: int
    dead_letter_of: str
    def __init__(self, config: _Optional[_Union[QueueConfig, _Mapping]] = ..., queue_id: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., dead_letter_of: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("name", "scope", "destructive")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    DESTRUCTIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    scope: PurgeScope
    destructive: bool
    def __init__(self, name: _Optional[str] = ..., scope: _Optional[_Union[PurgeScope, str]] = ..., destructive: _Optional[bool] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("purged_messages", "skipped_deliveries")
    PURGED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    purged_messages: int
    skipped_deliveries: int
    def __init__(self, purged_messages: _Optional[int] = ..., skipped_deliveries: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("name", "partitions", "messages", "bytes", "groups", "dead_letters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStats]
    messages: int
    bytes: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupLag]
    dead_letters: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionStats, _Mapping]]] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupLag, _Mapping]]] = ..., dead_letters: _Optional[int] = ...) -> None: ...

class GroupLag(_message.Message):
    __slots__ = ("name", "lag", "in_flight", "scheduled")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    name: str
    lag: int
    in_flight: int
    scheduled: int
    def __init__(self, name: _Optional[str] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., scheduled: _Optional[int] = ...) -> None: ...

class PublishMessage(_message.Message):
    __slots__ = ("key", "value", "headers", "partition", "idempotency_key", "deliver_at_ms", "delay_ms")
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
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    partition: int
    idempotency_key: str
    deliver_at_ms: int
    delay_ms: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ..., partition: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., deliver_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("queue", "messages", "request_timeout_ms", "producer", "encoded")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    queue: str
    messages: _containers.RepeatedCompositeFieldContainer[PublishMessage]
    request_timeout_ms: int
    producer: ProducerSession
    encoded: EncodedRecords
    def __init__(self, queue: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[PublishMessage, _Mapping]]] = ..., request_timeout_ms: _Optional[int] = ..., producer: _Optional[_Union[ProducerSession, _Mapping]] = ..., encoded: _Optional[_Union[EncodedRecords, _Mapping]] = ...) -> None: ...

class EncodedRecords(_message.Message):
    __slots__ = ("partition", "count", "records")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    count: int
    records: bytes
    def __init__(self, partition: _Optional[int] = ..., count: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class PublishedBatch(_message.Message):
    __slots__ = ("partition", "base_offset", "count", "timestamp_ms", "duplicate", "pending")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int
    duplicate: bool
    pending: bool
    def __init__(self, partition: _Optional[int] = ..., base_offset: _Optional[int] = ..., count: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ..., pending: _Optional[bool] = ...) -> None: ...

class ProducerSession(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "first_sequence")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    first_sequence: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., first_sequence: _Optional[int] = ...) -> None: ...

class InitProducerRequest(_message.Message):
    __slots__ = ("queue", "producer_name")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    queue: str
    producer_name: str
    def __init__(self, queue: _Optional[str] = ..., producer_name: _Optional[str] = ...) -> None: ...

class InitProducerResponse(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "idle_expiry_ms")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    IDLE_EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    idle_expiry_ms: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., idle_expiry_ms: _Optional[int] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("partition", "offset", "timestamp_ms", "duplicate", "pending")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool
    pending: bool
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ..., pending: _Optional[bool] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("results", "batch")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    batch: PublishedBatch
    def __init__(self, results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ..., batch: _Optional[_Union[PublishedBatch, _Mapping]] = ...) -> None: ...

class PublishStreamRequest(_message.Message):
    __slots__ = ("sequence", "publish")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    publish: PublishRequest
    def __init__(self, sequence: _Optional[int] = ..., publish: _Optional[_Union[PublishRequest, _Mapping]] = ...) -> None: ...

class PublishStreamResponse(_message.Message):
    __slots__ = ("sequence", "results", "error", "batch")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    error: RequestError
    batch: PublishedBatch
    def __init__(self, sequence: _Optional[int] = ..., results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ..., error: _Optional[_Union[RequestError, _Mapping]] = ..., batch: _Optional[_Union[PublishedBatch, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("queue", "partition", "offset", "max_messages", "max_bytes", "wait_ms", "record_batches")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    RECORD_BATCHES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partition: int
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int
    record_batches: bool
    def __init__(self, queue: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., record_batches: _Optional[bool] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("records", "next_offset", "high_watermark", "low_watermark", "record_batches", "log_id")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    RECORD_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    next_offset: int
    high_watermark: int
    low_watermark: int
    record_batches: _containers.RepeatedCompositeFieldContainer[RecordBatch]
    log_id: int
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., low_watermark: _Optional[int] = ..., record_batches: _Optional[_Iterable[_Union[RecordBatch, _Mapping]]] = ..., log_id: _Optional[int] = ...) -> None: ...

class RecordBatch(_message.Message):
    __slots__ = ("base_offset", "data")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    data: bytes
    def __init__(self, base_offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

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
    __slots__ = ("queue", "partitions", "start", "max_messages", "record_batches")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RECORD_BATCHES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    start: StartPosition
    max_messages: int
    record_batches: bool
    def __init__(self, queue: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., start: _Optional[_Union[StartPosition, _Mapping]] = ..., max_messages: _Optional[int] = ..., record_batches: _Optional[bool] = ...) -> None: ...

class TailResponse(_message.Message):
    __slots__ = ("records", "partitions")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    partitions: _containers.RepeatedCompositeFieldContainer[TailBatches]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[TailBatches, _Mapping]]] = ...) -> None: ...

class TailBatches(_message.Message):
    __slots__ = ("partition", "from_offset", "next_offset", "record_batches", "log_id")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    partition: int
    from_offset: int
    next_offset: int
    record_batches: _containers.RepeatedCompositeFieldContainer[RecordBatch]
    log_id: int
    def __init__(self, partition: _Optional[int] = ..., from_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., record_batches: _Optional[_Iterable[_Union[RecordBatch, _Mapping]]] = ..., log_id: _Optional[int] = ...) -> None: ...

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

class GroupFilter(_message.Message):
    __slots__ = ("header_equals", "key_prefix")
    class HeaderEqualsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    HEADER_EQUALS_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    header_equals: _containers.ScalarMap[str, bytes]
    key_prefix: bytes
    def __init__(self, header_equals: _Optional[_Mapping[str, bytes]] = ..., key_prefix: _Optional[bytes] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("queue", "group", "start", "mode", "filter")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    start: StartPosition
    mode: DeliveryMode
    filter: GroupFilter
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., start: _Optional[_Union[StartPosition, _Mapping]] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., filter: _Optional[_Union[GroupFilter, _Mapping]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("queue", "name", "mode", "filter", "start", "created_at_ms", "group_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    name: str
    mode: DeliveryMode
    filter: GroupFilter
    start: StartPosition
    created_at_ms: int
    group_id: int
    def __init__(self, queue: _Optional[str] = ..., name: _Optional[str] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., filter: _Optional[_Union[GroupFilter, _Mapping]] = ..., start: _Optional[_Union[StartPosition, _Mapping]] = ..., created_at_ms: _Optional[int] = ..., group_id: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[Group]
    def __init__(self, groups: _Optional[_Iterable[_Union[Group, _Mapping]]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GroupPartition(_message.Message):
    __slots__ = ("partition", "committed", "high_watermark", "lag", "in_flight", "scheduled", "dead", "filtered", "skipped_by_retention", "acked", "delivered_up_to")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_BY_RETENTION_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_UP_TO_FIELD_NUMBER: _ClassVar[int]
    partition: int
    committed: int
    high_watermark: int
    lag: int
    in_flight: int
    scheduled: int
    dead: int
    filtered: int
    skipped_by_retention: int
    acked: int
    delivered_up_to: int
    def __init__(self, partition: _Optional[int] = ..., committed: _Optional[int] = ..., high_watermark: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., scheduled: _Optional[int] = ..., dead: _Optional[int] = ..., filtered: _Optional[int] = ..., skipped_by_retention: _Optional[int] = ..., acked: _Optional[int] = ..., delivered_up_to: _Optional[int] = ...) -> None: ...

class GroupDescription(_message.Message):
    __slots__ = ("group", "partitions", "in_flight_by_consumer", "members", "group_generation", "strategy", "streaming")
    class InFlightByConsumerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_BY_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    GROUP_GENERATION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    group: Group
    partitions: _containers.RepeatedCompositeFieldContainer[GroupPartition]
    in_flight_by_consumer: _containers.ScalarMap[str, int]
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    group_generation: int
    strategy: str
    streaming: _containers.RepeatedCompositeFieldContainer[StreamingConsumer]
    def __init__(self, group: _Optional[_Union[Group, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[GroupPartition, _Mapping]]] = ..., in_flight_by_consumer: _Optional[_Mapping[str, int]] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., group_generation: _Optional[int] = ..., strategy: _Optional[str] = ..., streaming: _Optional[_Iterable[_Union[StreamingConsumer, _Mapping]]] = ...) -> None: ...

class StreamingConsumer(_message.Message):
    __slots__ = ("consumer_id", "max_in_flight", "lease_ms", "member_id")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    max_in_flight: int
    lease_ms: int
    member_id: str
    def __init__(self, consumer_id: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., lease_ms: _Optional[int] = ..., member_id: _Optional[str] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("member_id", "consumer_id", "generation_id", "assigned", "revoking", "pending", "session_timeout_ms", "joined_at_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    consumer_id: str
    generation_id: int
    assigned: _containers.RepeatedScalarFieldContainer[int]
    revoking: _containers.RepeatedScalarFieldContainer[int]
    pending: _containers.RepeatedScalarFieldContainer[int]
    session_timeout_ms: int
    joined_at_ms: int
    def __init__(self, member_id: _Optional[str] = ..., consumer_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., assigned: _Optional[_Iterable[int]] = ..., revoking: _Optional[_Iterable[int]] = ..., pending: _Optional[_Iterable[int]] = ..., session_timeout_ms: _Optional[int] = ..., joined_at_ms: _Optional[int] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("queue", "group", "consumer_id", "session_timeout_ms", "strategy", "member_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    consumer_id: str
    session_timeout_ms: int
    strategy: str
    member_id: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., strategy: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("queue", "group", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class MemberAssignment(_message.Message):
    __slots__ = ("member_id", "generation_id", "assigned", "revoking", "pending", "heartbeat_interval_ms", "should_rejoin", "group_generation", "reason")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SHOULD_REJOIN_FIELD_NUMBER: _ClassVar[int]
    GROUP_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    generation_id: int
    assigned: _containers.RepeatedScalarFieldContainer[int]
    revoking: _containers.RepeatedScalarFieldContainer[int]
    pending: _containers.RepeatedScalarFieldContainer[int]
    heartbeat_interval_ms: int
    should_rejoin: bool
    group_generation: int
    reason: str
    def __init__(self, member_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., assigned: _Optional[_Iterable[int]] = ..., revoking: _Optional[_Iterable[int]] = ..., pending: _Optional[_Iterable[int]] = ..., heartbeat_interval_ms: _Optional[int] = ..., should_rejoin: _Optional[bool] = ..., group_generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("queue", "group", "member_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    member_id: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("partition", "offset", "attempt", "lease_deadline_ms", "lease_id", "group_id")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    attempt: int
    lease_deadline_ms: int
    lease_id: int
    group_id: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., attempt: _Optional[int] = ..., lease_deadline_ms: _Optional[int] = ..., lease_id: _Optional[int] = ..., group_id: _Optional[int] = ...) -> None: ...

class LeasedMessage(_message.Message):
    __slots__ = ("record", "receipt")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    record: Record
    receipt: Receipt
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("queue", "group", "consumer_id", "max_messages", "lease_ms", "wait_ms", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    consumer_id: str
    max_messages: int
    lease_ms: int
    wait_ms: int
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., max_messages: _Optional[int] = ..., lease_ms: _Optional[int] = ..., wait_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[LeasedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[LeasedMessage, _Mapping]]] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("queue", "group", "consumer_id", "max_in_flight", "lease_ms", "batch_max", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    consumer_id: str
    max_in_flight: int
    lease_ms: int
    batch_max: int
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., lease_ms: _Optional[int] = ..., batch_max: _Optional[int] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[LeasedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[LeasedMessage, _Mapping]]] = ...) -> None: ...

class EndConsumeRequest(_message.Message):
    __slots__ = ("queue", "group", "consumer_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    consumer_id: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ...) -> None: ...

class EndConsumeResponse(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    def __init__(self, ended: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("queue", "group", "receipts", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[Receipt]
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[ReceiptStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[ReceiptStatus, str]]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("queue", "group", "receipts", "retry_after_ms", "retry_at_ms", "dead", "reason", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[Receipt]
    retry_after_ms: int
    retry_at_ms: int
    dead: bool
    reason: str
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ..., retry_after_ms: _Optional[int] = ..., retry_at_ms: _Optional[int] = ..., dead: _Optional[bool] = ..., reason: _Optional[str] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[ReceiptStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[ReceiptStatus, str]]] = ...) -> None: ...

class ExtendLeaseRequest(_message.Message):
    __slots__ = ("queue", "group", "receipts", "lease_ms", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[Receipt]
    lease_ms: int
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ..., lease_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class ExtendLeaseResponse(_message.Message):
    __slots__ = ("statuses", "lease_deadlines_ms")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINES_MS_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[ReceiptStatus]
    lease_deadlines_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, statuses: _Optional[_Iterable[_Union[ReceiptStatus, str]]] = ..., lease_deadlines_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionOffsets(_message.Message):
    __slots__ = ("partition", "committed", "latest", "lag", "reset_to", "in_flight", "scheduled")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    RESET_TO_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    partition: int
    committed: int
    latest: int
    lag: int
    reset_to: int
    in_flight: int
    scheduled: int
    def __init__(self, partition: _Optional[int] = ..., committed: _Optional[int] = ..., latest: _Optional[int] = ..., lag: _Optional[int] = ..., reset_to: _Optional[int] = ..., in_flight: _Optional[int] = ..., scheduled: _Optional[int] = ...) -> None: ...

class OffsetsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionOffsets]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionOffsets, _Mapping]]] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("queue", "group", "offsets", "member_id", "generation_id")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    offsets: _containers.ScalarMap[int, int]
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class GetOffsetsRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("queue", "group", "partitions", "to", "dry_run")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    to: StartPosition
    dry_run: bool
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., to: _Optional[_Union[StartPosition, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("id", "record", "group", "reason", "attempts", "dead_at_ms", "original_partition", "original_offset")
    ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_PARTITION_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    id: int
    record: Record
    group: str
    reason: str
    attempts: int
    dead_at_ms: int
    original_partition: int
    original_offset: int
    def __init__(self, id: _Optional[int] = ..., record: _Optional[_Union[Record, _Mapping]] = ..., group: _Optional[str] = ..., reason: _Optional[str] = ..., attempts: _Optional[int] = ..., dead_at_ms: _Optional[int] = ..., original_partition: _Optional[int] = ..., original_offset: _Optional[int] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("queue", "group", "from_ms", "to_ms", "page_token", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    from_ms: int
    to_ms: int
    page_token: str
    limit: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., page_token: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("queue", "ids", "all", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    group: str
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ..., group: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("replayed",)
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    replayed: int
    def __init__(self, replayed: _Optional[int] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ("queue", "ids", "all")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    queue: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class TransactRequest(_message.Message):
    __slots__ = ("acks", "publishes", "request_timeout_ms")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckRequest]
    publishes: _containers.RepeatedCompositeFieldContainer[PublishRequest]
    request_timeout_ms: int
    def __init__(self, acks: _Optional[_Iterable[_Union[AckRequest, _Mapping]]] = ..., publishes: _Optional[_Iterable[_Union[PublishRequest, _Mapping]]] = ..., request_timeout_ms: _Optional[int] = ...) -> None: ...

class TransactResponse(_message.Message):
    __slots__ = ("acks", "publishes")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckResponse]
    publishes: _containers.RepeatedCompositeFieldContainer[PublishResponse]
    def __init__(self, acks: _Optional[_Iterable[_Union[AckResponse, _Mapping]]] = ..., publishes: _Optional[_Iterable[_Union[PublishResponse, _Mapping]]] = ...) -> None: ...
