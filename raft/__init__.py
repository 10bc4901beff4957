"""Replication groups ("shards"): ordered, durable application of opaque commands."""

from raft.api import (
    Appended,
    Entry,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalTimeoutError,
    Shard,
    ShardBusyError,
    ShardClosedError,
    ShardError,
    ShardRequestDeniedError,
    ShardStatus,
    StateMachine,
)
from raft.local import LocalShard

__all__ = [
    "Appended",
    "Entry",
    "LocalShard",
    "NotLeaderError",
    "OutcomeUnknownError",
    "ProposalTimeoutError",
    "Shard",
    "ShardBusyError",
    "ShardClosedError",
    "ShardError",
    "ShardRequestDeniedError",
    "ShardStatus",
    "StateMachine",
]
