"""What applying a command returns (besides ``pb.Queue``, ``int``, ``None`` and the refusal, a
``FluxError``): the same on every replica, since it is computed from the replicated state."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import membership as msh
from fluxmq.core.delivery import Delivery


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Per message, in request order (columns rather than objects: this is the hot path)."""

    partitions: list[int]
    offsets: list[int]
    timestamps_ms: list[int]
    duplicates: list[bool]
    high_watermarks: dict[int, int]  # partition -> high watermark after the append
    # Asynchronous replication: accepted into the leader's log, not applied yet, so offsets,
    # timestamps and duplicates are not known (zeros).
    pending: bool = False


@dataclass(frozen=True, slots=True)
class LeaseResult:
    group_id: int
    deliveries: list[Delivery]


@dataclass(frozen=True, slots=True)
class SettleResult:
    """Ack / Nack / ExtendLease: one status per receipt (fluxmq.v1.ReceiptStatus)."""

    statuses: list[int]
    deadlines_ms: list[int] = field(default_factory=list)


def member_view(m: msh.Member) -> pb.GroupMember:
    return pb.GroupMember(
        member_id=m.member_id,
        consumer_id=m.consumer_id,
        generation_id=m.generation,
        assigned=sorted(m.owned),
        revoking=sorted(m.revoking),
        pending=sorted(m.pending),
        session_timeout_ms=m.session_timeout_ms,
        joined_at_ms=m.joined_ms,
    )


@dataclass(frozen=True, slots=True)
class MemberResult:
    """JoinGroup / ReleasePartitions: the member as it is after the command."""

    member: pb.GroupMember
    group_generation: int
    released: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PurgeResult:
    purged_records: int
    skipped_deliveries: int


@dataclass(frozen=True, slots=True)
class TransactResult:
    acks: list[SettleResult]
    appends: list[AppendResult]


@dataclass(slots=True)
class ExpireResult:
    expired_leases: int = 0
    expired_ttl: int = 0
    dead_letters: int = 0


@dataclass(slots=True)
class RetentionResult:
    removed_records: int = 0
    removed_bytes: int = 0
    expired_dedup_keys: int = 0
    dropped_records: int = 0
    expired_producers: int = 0
