from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("node_id", "shards", "nodes", "metadata_error", "groups")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    METADATA_ERROR_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEntry]
    metadata_error: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupEntry]
    def __init__(self, node_id: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeEntry, _Mapping]]] = ..., metadata_error: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupEntry, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("shard_id", "role", "term", "commit_index", "applied_index", "members", "leader", "pending_proposals", "digest", "queues")
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
    def __init__(self, shard_id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., pending_proposals: _Optional[int] = ..., digest: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ...) -> None: ...

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
