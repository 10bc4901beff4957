from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateApiKeyRequest(_message.Message):
    __slots__ = ("name", "role", "tier", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    tier: str
    environment: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., tier: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class CreateApiKeyResponse(_message.Message):
    __slots__ = ("key", "info")
    KEY_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    key: str
    info: ApiKeyInfo
    def __init__(self, key: _Optional[str] = ..., info: _Optional[_Union[ApiKeyInfo, _Mapping]] = ...) -> None: ...

class ListApiKeysRequest(_message.Message):
    __slots__ = ("include_revoked",)
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    include_revoked: bool
    def __init__(self, include_revoked: _Optional[bool] = ...) -> None: ...

class ListApiKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKeyInfo]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKeyInfo, _Mapping]]] = ...) -> None: ...

class RevokeApiKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class ApiKeyInfo(_message.Message):
    __slots__ = ("key_id", "prefix", "name", "environment", "role", "tier", "created_ms", "last_used_ms", "revoked_ms")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_MS_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    prefix: str
    name: str
    environment: str
    role: str
    tier: str
    created_ms: int
    last_used_ms: int
    revoked_ms: int
    def __init__(self, key_id: _Optional[str] = ..., prefix: _Optional[str] = ..., name: _Optional[str] = ..., environment: _Optional[str] = ..., role: _Optional[str] = ..., tier: _Optional[str] = ..., created_ms: _Optional[int] = ..., last_used_ms: _Optional[int] = ..., revoked_ms: _Optional[int] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ("skip_digest",)
    SKIP_DIGEST_FIELD_NUMBER: _ClassVar[int]
    skip_digest: bool
    def __init__(self, skip_digest: _Optional[bool] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("node_id", "shards", "nodes", "metadata_error", "groups", "queues", "queue_counters", "rpcs", "sampled_ms", "readiness", "etcd_session")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    METADATA_ERROR_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_MS_FIELD_NUMBER: _ClassVar[int]
    READINESS_FIELD_NUMBER: _ClassVar[int]
    ETCD_SESSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEntry]
    metadata_error: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupEntry]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStatus]
    queue_counters: _containers.RepeatedCompositeFieldContainer[QueueCounters]
    rpcs: _containers.RepeatedCompositeFieldContainer[RpcMethodStats]
    sampled_ms: int
    readiness: str
    etcd_session: str
    def __init__(self, node_id: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeEntry, _Mapping]]] = ..., metadata_error: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupEntry, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[QueueStatus, _Mapping]]] = ..., queue_counters: _Optional[_Iterable[_Union[QueueCounters, _Mapping]]] = ..., rpcs: _Optional[_Iterable[_Union[RpcMethodStats, _Mapping]]] = ..., sampled_ms: _Optional[int] = ..., readiness: _Optional[str] = ..., etcd_session: _Optional[str] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("name", "shard_id", "partitions", "published_messages", "stored_messages", "stored_bytes", "dead_letter_queue", "dead_letters", "dead_letter_alert", "groups")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    STORED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_ALERT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    shard_id: str
    partitions: int
    published_messages: int
    stored_messages: int
    stored_bytes: int
    dead_letter_queue: str
    dead_letters: int
    dead_letter_alert: bool
    groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupStatus]
    def __init__(self, name: _Optional[str] = ..., shard_id: _Optional[str] = ..., partitions: _Optional[int] = ..., published_messages: _Optional[int] = ..., stored_messages: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., dead_letter_queue: _Optional[str] = ..., dead_letters: _Optional[int] = ..., dead_letter_alert: _Optional[bool] = ..., groups: _Optional[_Iterable[_Union[ConsumerGroupStatus, _Mapping]]] = ...) -> None: ...

class ConsumerGroupStatus(_message.Message):
    __slots__ = ("name", "lag", "in_flight", "scheduled", "dead_lettered", "filtered", "skipped_by_retention")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_BY_RETENTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    lag: int
    in_flight: int
    scheduled: int
    dead_lettered: int
    filtered: int
    skipped_by_retention: int
    def __init__(self, name: _Optional[str] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., scheduled: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., filtered: _Optional[int] = ..., skipped_by_retention: _Optional[int] = ...) -> None: ...

class QueueCounters(_message.Message):
    __slots__ = ("queue", "published_messages", "published_bytes", "delivered_messages", "delivered_bytes", "redelivered_messages", "acked_messages", "nacked_messages")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ACKED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NACKED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    published_messages: int
    published_bytes: int
    delivered_messages: int
    delivered_bytes: int
    redelivered_messages: int
    acked_messages: int
    nacked_messages: int
    def __init__(self, queue: _Optional[str] = ..., published_messages: _Optional[int] = ..., published_bytes: _Optional[int] = ..., delivered_messages: _Optional[int] = ..., delivered_bytes: _Optional[int] = ..., redelivered_messages: _Optional[int] = ..., acked_messages: _Optional[int] = ..., nacked_messages: _Optional[int] = ...) -> None: ...

class RpcMethodStats(_message.Message):
    __slots__ = ("method", "calls", "errors_by_code", "p50_ms", "p99_ms", "seconds_sum")
    class ErrorsByCodeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_BY_CODE_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SUM_FIELD_NUMBER: _ClassVar[int]
    method: str
    calls: int
    errors_by_code: _containers.ScalarMap[str, int]
    p50_ms: float
    p99_ms: float
    seconds_sum: float
    def __init__(self, method: _Optional[str] = ..., calls: _Optional[int] = ..., errors_by_code: _Optional[_Mapping[str, int]] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., seconds_sum: _Optional[float] = ...) -> None: ...

class GroupEntry(_message.Message):
    __slots__ = ("group_id", "members", "leader", "term")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    members: _containers.RepeatedScalarFieldContainer[str]
    leader: str
    term: int
    def __init__(self, group_id: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class NodeEntry(_message.Message):
    __slots__ = ("node_id", "grpc_address", "raft_address", "started_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_address: str
    raft_address: str
    started_ms: int
    def __init__(self, node_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., raft_address: _Optional[str] = ..., started_ms: _Optional[int] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("shard_id", "role", "term", "commit_index", "applied_index", "members", "leader", "pending_proposals", "digest", "queues", "in_sync_replicas", "on_probation")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PENDING_PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ON_PROBATION_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    role: str
    term: int
    commit_index: int
    applied_index: int
    members: _containers.RepeatedScalarFieldContainer[str]
    leader: str
    pending_proposals: int
    digest: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    in_sync_replicas: int
    on_probation: bool
    def __init__(self, shard_id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., pending_proposals: _Optional[int] = ..., digest: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., in_sync_replicas: _Optional[int] = ..., on_probation: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeSummary(_message.Message):
    __slots__ = ("node_id", "live", "state", "groups", "leading", "grpc_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    live: bool
    state: str
    groups: _containers.RepeatedScalarFieldContainer[str]
    leading: _containers.RepeatedScalarFieldContainer[str]
    grpc_address: str
    def __init__(self, node_id: _Optional[str] = ..., live: _Optional[bool] = ..., state: _Optional[str] = ..., groups: _Optional[_Iterable[str]] = ..., leading: _Optional[_Iterable[str]] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSummary]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeSummary, _Mapping]]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "until_restart")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UNTIL_RESTART_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    until_restart: bool
    def __init__(self, node_id: _Optional[str] = ..., until_restart: _Optional[bool] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DecommissionNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class MoveReplicaRequest(_message.Message):
    __slots__ = ("shard_id", "from_node", "to_node")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    from_node: str
    to_node: str
    def __init__(self, shard_id: _Optional[str] = ..., from_node: _Optional[str] = ..., to_node: _Optional[str] = ...) -> None: ...

class MoveReplicaResponse(_message.Message):
    __slots__ = ("shard_id", "members", "raft_port")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    RAFT_PORT_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    members: _containers.RepeatedScalarFieldContainer[str]
    raft_port: int
    def __init__(self, shard_id: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., raft_port: _Optional[int] = ...) -> None: ...

class RebalanceShardsRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class PlannedMove(_message.Message):
    __slots__ = ("shard_id", "from_node", "to_node", "written")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    from_node: str
    to_node: str
    written: bool
    def __init__(self, shard_id: _Optional[str] = ..., from_node: _Optional[str] = ..., to_node: _Optional[str] = ..., written: _Optional[bool] = ...) -> None: ...

class RebalanceShardsResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[PlannedMove]
    def __init__(self, moves: _Optional[_Iterable[_Union[PlannedMove, _Mapping]]] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("shard_id", "target")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    target: str
    def __init__(self, shard_id: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("target", "leader")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    target: str
    leader: str
    def __init__(self, target: _Optional[str] = ..., leader: _Optional[str] = ...) -> None: ...

class AddReplicaRequest(_message.Message):
    __slots__ = ("shard_id", "address")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    address: str
    def __init__(self, shard_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class RemoveReplicaRequest(_message.Message):
    __slots__ = ("shard_id", "address")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    address: str
    def __init__(self, shard_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...
