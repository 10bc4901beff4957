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
    __slots__ = ("queue", "queue_id", "now_ms", "records", "partitions", "idempotency_keys", "producer_id", "producer_epoch", "first_sequence", "batches")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    now_ms: int
    records: _containers.RepeatedScalarFieldContainer[bytes]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    idempotency_keys: _containers.RepeatedScalarFieldContainer[str]
    producer_id: int
    producer_epoch: int
    first_sequence: int
    batches: _containers.RepeatedCompositeFieldContainer[PartitionBatch]
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., now_ms: _Optional[int] = ..., records: _Optional[_Iterable[bytes]] = ..., partitions: _Optional[_Iterable[int]] = ..., idempotency_keys: _Optional[_Iterable[str]] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., first_sequence: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[PartitionBatch, _Mapping]]] = ...) -> None: ...

class PartitionBatch(_message.Message):
    __slots__ = ("partition", "count", "records")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    count: int
    records: bytes
    def __init__(self, partition: _Optional[int] = ..., count: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class InitProducerCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "now_ms", "producer_name")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    now_ms: int
    producer_name: str
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., now_ms: _Optional[int] = ..., producer_name: _Optional[str] = ...) -> None: ...

class PurgeCmd(_message.Message):
    __slots__ = ("name", "queue_id", "now_ms", "scope", "destructive")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    DESTRUCTIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_id: int
    now_ms: int
    scope: _queue_pb2.PurgeScope
    destructive: bool
    def __init__(self, name: _Optional[str] = ..., queue_id: _Optional[int] = ..., now_ms: _Optional[int] = ..., scope: _Optional[_Union[_queue_pb2.PurgeScope, str]] = ..., destructive: _Optional[bool] = ...) -> None: ...

class ApplyRetentionCmd(_message.Message):
    __slots__ = ("now_ms",)
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    now_ms: int
    def __init__(self, now_ms: _Optional[int] = ...) -> None: ...

class CreateGroupCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "start", "mode", "filter", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    start: _queue_pb2.StartPosition
    mode: _queue_pb2.DeliveryMode
    filter: _queue_pb2.GroupFilter
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., start: _Optional[_Union[_queue_pb2.StartPosition, _Mapping]] = ..., mode: _Optional[_Union[_queue_pb2.DeliveryMode, str]] = ..., filter: _Optional[_Union[_queue_pb2.GroupFilter, _Mapping]] = ..., now_ms: _Optional[int] = ...) -> None: ...

class DeleteGroupCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class LeaseCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "consumer_id", "max_messages", "lease_ms", "now_ms", "member")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    consumer_id: str
    max_messages: int
    lease_ms: int
    now_ms: int
    member: MemberRef
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., max_messages: _Optional[int] = ..., lease_ms: _Optional[int] = ..., now_ms: _Optional[int] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class AckCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "receipts", "now_ms", "member")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[_queue_pb2.Receipt]
    now_ms: int
    member: MemberRef
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[_queue_pb2.Receipt, _Mapping]]] = ..., now_ms: _Optional[int] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class NackCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "receipts", "now_ms", "retry_at_ms", "dead", "reason", "member")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[_queue_pb2.Receipt]
    now_ms: int
    retry_at_ms: int
    dead: bool
    reason: str
    member: MemberRef
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[_queue_pb2.Receipt, _Mapping]]] = ..., now_ms: _Optional[int] = ..., retry_at_ms: _Optional[int] = ..., dead: _Optional[bool] = ..., reason: _Optional[str] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class ExtendLeaseCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "receipts", "now_ms", "lease_ms", "member")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    receipts: _containers.RepeatedCompositeFieldContainer[_queue_pb2.Receipt]
    now_ms: int
    lease_ms: int
    member: MemberRef
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[_queue_pb2.Receipt, _Mapping]]] = ..., now_ms: _Optional[int] = ..., lease_ms: _Optional[int] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class ExpireLeasesCmd(_message.Message):
    __slots__ = ("now_ms",)
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    now_ms: int
    def __init__(self, now_ms: _Optional[int] = ...) -> None: ...

class CommitOffsetsCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "offsets", "member")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    offsets: _containers.ScalarMap[int, int]
    member: MemberRef
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., offsets: _Optional[_Mapping[int, int]] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class ResetOffsetsCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "partitions", "to")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    to: _queue_pb2.StartPosition
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., to: _Optional[_Union[_queue_pb2.StartPosition, _Mapping]] = ...) -> None: ...

class ReplayDeadLettersCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "ids", "all", "group", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    ids: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    group: str
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., ids: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ..., group: _Optional[str] = ..., now_ms: _Optional[int] = ...) -> None: ...

class PurgeDeadLettersCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "ids", "all")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    ids: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., ids: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ...) -> None: ...

class TransactCmd(_message.Message):
    __slots__ = ("acks", "appends")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    APPENDS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckCmd]
    appends: _containers.RepeatedCompositeFieldContainer[AppendCmd]
    def __init__(self, acks: _Optional[_Iterable[_Union[AckCmd, _Mapping]]] = ..., appends: _Optional[_Iterable[_Union[AppendCmd, _Mapping]]] = ...) -> None: ...

class CheckoutCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "consumer_id", "max_in_flight", "lease_ms", "session_id", "member", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    consumer_id: str
    max_in_flight: int
    lease_ms: int
    session_id: int
    member: MemberRef
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., lease_ms: _Optional[int] = ..., session_id: _Optional[int] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ..., now_ms: _Optional[int] = ...) -> None: ...

class CheckinCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "consumers", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    consumers: _containers.RepeatedCompositeFieldContainer[CheckinOf]
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumers: _Optional[_Iterable[_Union[CheckinOf, _Mapping]]] = ..., now_ms: _Optional[int] = ...) -> None: ...

class CheckinOf(_message.Message):
    __slots__ = ("group", "consumer_id", "session_id", "release")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    group: str
    consumer_id: str
    session_id: int
    release: bool
    def __init__(self, group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., session_id: _Optional[int] = ..., release: _Optional[bool] = ...) -> None: ...

class CheckoutState(_message.Message):
    __slots__ = ("consumer_id", "max_in_flight", "lease_ms", "session_id", "member")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    max_in_flight: int
    lease_ms: int
    session_id: int
    member: MemberRef
    def __init__(self, consumer_id: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., lease_ms: _Optional[int] = ..., session_id: _Optional[int] = ..., member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class MemberRef(_message.Message):
    __slots__ = ("member_id", "generation_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    generation_id: int
    def __init__(self, member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class JoinGroupCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "consumer_id", "member_id", "session_timeout_ms", "strategy", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    consumer_id: str
    member_id: str
    session_timeout_ms: int
    strategy: str
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., member_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., strategy: _Optional[str] = ..., now_ms: _Optional[int] = ...) -> None: ...

class LeaveGroupCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "member_id", "now_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    member_id: str
    now_ms: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ..., now_ms: _Optional[int] = ...) -> None: ...

class ReleasePartitionsCmd(_message.Message):
    __slots__ = ("queue", "queue_id", "group", "member_id", "generation_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    queue_id: int
    group: str
    member_id: str
    generation_id: int
    def __init__(self, queue: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ..., generation_id: _Optional[int] = ...) -> None: ...

class ExpireMembersCmd(_message.Message):
    __slots__ = ("now_ms", "members")
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    now_ms: int
    members: _containers.RepeatedCompositeFieldContainer[ExpiredMember]
    def __init__(self, now_ms: _Optional[int] = ..., members: _Optional[_Iterable[_Union[ExpiredMember, _Mapping]]] = ...) -> None: ...

class ExpiredMember(_message.Message):
    __slots__ = ("group_id", "member_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: int
    member_id: str
    def __init__(self, group_id: _Optional[int] = ..., member_id: _Optional[str] = ...) -> None: ...

class RecordNodeAddressCmd(_message.Message):
    __slots__ = ("raft_address", "grpc_address")
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    raft_address: str
    grpc_address: str
    def __init__(self, raft_address: _Optional[str] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class MemberState(_message.Message):
    __slots__ = ("member_id", "consumer_id", "session_timeout_ms", "generation", "fenced_below", "owned", "revoking", "pending", "joined_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FENCED_BELOW_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    JOINED_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    consumer_id: str
    session_timeout_ms: int
    generation: int
    fenced_below: int
    owned: _containers.RepeatedScalarFieldContainer[int]
    revoking: _containers.RepeatedScalarFieldContainer[int]
    pending: _containers.RepeatedScalarFieldContainer[int]
    joined_ms: int
    def __init__(self, member_id: _Optional[str] = ..., consumer_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., generation: _Optional[int] = ..., fenced_below: _Optional[int] = ..., owned: _Optional[_Iterable[int]] = ..., revoking: _Optional[_Iterable[int]] = ..., pending: _Optional[_Iterable[int]] = ..., joined_ms: _Optional[int] = ...) -> None: ...

class MembershipState(_message.Message):
    __slots__ = ("group_generation", "strategy", "members")
    GROUP_GENERATION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group_generation: int
    strategy: str
    members: _containers.RepeatedCompositeFieldContainer[MemberState]
    def __init__(self, group_generation: _Optional[int] = ..., strategy: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberState, _Mapping]]] = ...) -> None: ...
