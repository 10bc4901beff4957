"""Replication groups ("shards"): ordered, durable application of opaque commands."""

from raft.api import (
    Entry,
    NotLeaderError,
    ProposalTimeoutError,
    Shard,
    ShardBusyError,
    ShardClosedError,
    ShardError,
    ShardStatus,
    StateMachine,
)
from raft.local import LocalShard

__all__ = [
    "Entry",
    "LocalShard",
    "NotLeaderError",
    "ProposalTimeoutError",
    "Shard",
    "ShardBusyError",
    "ShardClosedError",
    "ShardError",
    "ShardStatus",
    "StateMachine",
]
