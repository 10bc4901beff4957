"""The metadata store: live nodes, replication groups, queue placement, shard leaders, settings,
API keys.

``MetadataStore`` is the interface; ``EtcdMetadataStore`` keeps the metadata in etcd for a
cluster, ``EmbeddedMetadataStore`` in a local LMDB file (or memory) for a single node.
"""

from fluxmq.metadata.embedded import EmbeddedMetadataStore
from fluxmq.metadata.etcd import EtcdMetadataStore
from fluxmq.metadata.metadata import (
    AlreadyExists,
    LimitExceeded,
    MetadataCorrupt,
    MetadataError,
    MetadataEvent,
    MetadataStore,
    MetadataUnavailable,
    MetadataWatch,
    NodeInfo,
    NodeNotRegistered,
    NotFound,
    Placement,
    PortTaken,
    RevisionConflict,
    ShardRecord,
    Versioned,
)

__all__ = [
    "AlreadyExists",
    "EmbeddedMetadataStore",
    "EtcdMetadataStore",
    "LimitExceeded",
    "MetadataCorrupt",
    "MetadataError",
    "MetadataEvent",
    "MetadataStore",
    "MetadataUnavailable",
    "MetadataWatch",
    "NodeInfo",
    "NodeNotRegistered",
    "NotFound",
    "Placement",
    "PortTaken",
    "RevisionConflict",
    "ShardRecord",
    "Versioned",
]
