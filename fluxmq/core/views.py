"""Immutable views of a shard's state, published by the apply side after each commit.

The apply side (one applier at a time: a Raft shard's driver or apply thread, or the single-node
shard's worker) owns the mutable state: the catalog it swaps, and ``DeliveryState``. After each
commit it builds a ``StateView`` and swaps it in with one reference assignment. A reader on the
event loop takes the current view once per request and reads only it (plus LMDB read
transactions, which are snapshots too): it never sees half of a batch and never waits on an
apply, let alone on its fsync. There is no lock between the two sides.

Publishing costs what the batch touched: a view shares every group view that did not change with
the view before it, and a group view is built from counters the delivery state keeps anyway
(scheduled slots are walked only in partitions that have some).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, limits
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.delivery import (
    SCHEDULED,
    Checkout,
    DeliveryState,
    GroupState,
    PartState,
    expired,
    group_not_found,
)
from fluxmq.core.membership import Membership
from fluxmq.core.queue_config import QueuePolicy
from storage.api import ReadTxn

_READ_BYTES_MAX = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """One group partition at one commit: its counters and what a reader decides from."""

    partition: int
    committed: int
    next: int
    acked: int
    dead: int
    filtered: int
    skipped: int
    purged: int
    pending: int  # slots: leased or scheduled
    leased: int
    scheduled_due_ms: tuple[int, ...]  # ready time of each scheduled slot, ascending
    first_scheduled_due_ms: int | None  # of the scheduled slot with the lowest offset
    # The earliest ready time of a scheduled slot: exact, where the state's heap may hold stale
    # entries (this view is built from the slots themselves).
    ready_head_ms: int | None

    @classmethod
    def of(cls, p: int, part: PartState) -> PartitionSummary:
        due: tuple[int, ...] = ()
        first: int | None = None
        if part.scheduled:
            scheduled = [(o, s.due_ms) for o, s in part.slots.items() if s.kind == SCHEDULED]
            due = tuple(sorted(d for _, d in scheduled))
            first = min(scheduled)[1] if scheduled else None
        return cls(
            partition=p,
            committed=part.committed,
            next=part.next,
            acked=part.acked,
            dead=part.dead,
            filtered=part.filtered,
            skipped=part.skipped,
            purged=part.purged,
            pending=len(part.slots),
            leased=part.leased,
            scheduled_due_ms=due,
            first_scheduled_due_ms=first,
            ready_head_ms=due[0] if due else None,
        )

    @classmethod
    def empty(cls, p: int) -> PartitionSummary:
        return cls(p, 0, 0, 0, 0, 0, 0, 0, 0, 0, (), None, None)

    @property
    def scheduled(self) -> int:
        return len(self.scheduled_due_ms)

    def scheduled_after(self, now_ms: int) -> int:
        """Scheduled slots not due at ``now_ms``."""
        return sum(1 for due in self.scheduled_due_ms if due > now_ms)


@dataclass(frozen=True, slots=True)
class GroupView:
    """One consumer group at one commit. Never changes; the next commit builds a new one."""

    meta: pb.Group  # a copy nobody mutates
    queue_id: int
    parts: Mapping[int, PartitionSummary]
    in_flight_by_member: Mapping[str, int]
    membership: Membership | None  # a copy; None until somebody joins
    expiry_head_ms: int | None  # the earliest lease deadline (maybe of a stale heap entry)
    checkouts: Mapping[str, Checkout]  # consumer id -> its checkout (Consume streams)

    @classmethod
    def of(cls, g: GroupState, before: GroupView | None = None) -> GroupView:
        """``g`` as it is now. ``before``: its view before this commit, when its meta (never
        changed after creation) and membership (not saved in this commit) are still valid:
        those copies are shared instead of made again."""
        if before is not None:
            meta, membership = before.meta, before.membership
        else:
            meta = pb.Group()
            meta.CopyFrom(g.meta)
            membership = g.membership.copy() if g.membership is not None else None
        return cls(
            meta=meta,
            queue_id=g.queue_id,
            parts=MappingProxyType({p: PartitionSummary.of(p, g.parts[p]) for p in g.parts}),
            in_flight_by_member=MappingProxyType(dict(g.in_flight_by_member)),
            membership=membership,
            expiry_head_ms=g.expiry[0][0] if g.expiry else None,
            checkouts=MappingProxyType(dict(g.checkouts)),
        )

    @property
    def group_id(self) -> int:
        return int(self.meta.group_id)

    @property
    def name(self) -> str:
        return str(self.meta.name)

    @property
    def ordered(self) -> bool:
        return bool(self.meta.mode == pb.DELIVERY_MODE_ORDERED)

    def part(self, p: int) -> PartitionSummary:
        return self.parts.get(p) or PartitionSummary.empty(p)

    def busy(self, p: int) -> bool:
        """Whether a partition of an ordered group still has a batch out (it cannot move)."""
        part = self.parts.get(p)
        return part is not None and part.leased > 0

    def next_ready_ms(self) -> int | None:
        """The earliest due time of a scheduled message."""
        heads = [s.ready_head_ms for s in self.parts.values() if s.ready_head_ms is not None]
        return min(heads) if heads else None

    def maybe_ready(self, highs: Mapping[int, int], now_ms: int) -> bool:
        """Whether a Lease at ``now_ms`` could hand out (or at least move past) something, given
        each partition's high watermark: lets the leader skip proposing empty leases."""
        for p, high in highs.items():
            part = self.parts.get(p)
            if part is None:
                if high > 0:
                    return True
                continue
            if self.ordered and part.leased:
                continue
            if (
                part.next < high
                and part.pending < limits.PENDING_PER_PARTITION_MAX
                and (not self.ordered or not part.scheduled)
            ):
                return True
            if self.ordered:
                first = part.first_scheduled_due_ms
                if first is not None and first <= now_ms:
                    return True
            elif part.ready_head_ms is not None and part.ready_head_ms <= now_ms:
                return True
        return False


@dataclass(frozen=True, slots=True)
class DeliveryView:
    """Every consumer group of a store at one commit."""

    by_id: Mapping[int, GroupView]
    by_queue: Mapping[int, Mapping[str, GroupView]]

    @classmethod
    def of(cls, state: DeliveryState) -> DeliveryView:
        """The whole view, built from nothing (at start, after a snapshot or a rollback)."""
        every = [g.group_id for g in state.iter_groups()]
        return cls.changed(cls.empty(), state, every, every)

    @classmethod
    def empty(cls) -> DeliveryView:
        return cls(MappingProxyType({}), MappingProxyType({}))

    @classmethod
    def changed(
        cls,
        before: DeliveryView,
        state: DeliveryState,
        touched: Iterable[int],
        members_touched: Collection[int],
    ) -> DeliveryView:
        """``before`` with the groups in ``touched`` read again from ``state`` (gone ones
        dropped); every other group view is shared with ``before``. ``members_touched``: the
        groups whose membership changed (the others keep their membership copy)."""
        by_id = dict(before.by_id)
        queues: set[int] = set()
        for group_id in touched:
            old = by_id.pop(group_id, None)
            if old is not None:
                queues.add(old.queue_id)
            g = state.by_id(group_id)
            if g is not None:
                same = old is not None and old.queue_id == g.queue_id
                keep = old if same and group_id not in members_touched else None
                by_id[group_id] = GroupView.of(g, keep)
                queues.add(g.queue_id)
        if not queues:  # nothing was there before nor is now
            return before
        by_queue = dict(before.by_queue)
        for queue_id in queues:
            named = {name: by_id[g.group_id] for name, g in state.groups.get(queue_id, {}).items()}
            if named:
                by_queue[queue_id] = MappingProxyType(named)
            else:
                by_queue.pop(queue_id, None)
        return cls(MappingProxyType(by_id), MappingProxyType(by_queue))

    def get(self, queue_id: int, queue: str, name: str) -> GroupView:
        g = self.by_queue.get(queue_id, {}).get(name)
        if g is None:
            raise group_not_found(queue, name)
        return g

    def of_queue(self, queue_id: int) -> list[GroupView]:
        return sorted(self.by_queue.get(queue_id, {}).values(), key=lambda g: g.group_id)

    def all_groups(self) -> list[GroupView]:
        return [self.by_id[k] for k in sorted(self.by_id)]

    def next_deadline_ms(self) -> int | None:
        """The earliest lease deadline (maybe of a stale heap entry: then a pass does nothing)."""
        heads = [g.expiry_head_ms for g in self.by_id.values() if g.expiry_head_ms is not None]
        return min(heads) if heads else None

    def consumed_floor(self, queue_id: int, partition: int, high: int) -> int:
        """The smallest offset some group of the queue still needs (``high`` if none)."""
        floor = high
        for g in self.by_queue.get(queue_id, {}).values():
            part = g.parts.get(partition)
            floor = min(floor, part.committed if part is not None else 0)
        return floor

    def ttl_due(self, txn: ReadTxn, policies: Mapping[int, QueuePolicy], now_ms: int) -> bool:
        """Whether some group's next message has outlived its queue's TTL at ``now_ms``."""
        for g in self.by_id.values():
            policy = policies.get(g.queue_id)
            if policy is None or not policy.message_ttl_ms:
                continue
            for p in range(policy.partitions):
                part = g.parts.get(p)
                log = txn.log(keys.log_id(g.queue_id, p))
                wm = log.watermarks()
                start = max(part.next if part else 0, wm.low)
                if start < wm.high and expired(
                    log.read(start, 1, _READ_BYTES_MAX)[0], policy, now_ms
                ):
                    return True
        return False


@dataclass(frozen=True, slots=True)
class StateView:
    """What the event loop reads of a shard's state: one commit's catalog, node addresses,
    applied index and consumer groups, all from the same commit."""

    applied_index: int
    catalog: Mapping[str, QueueEntry]
    node_addresses: Mapping[str, str]  # raft address -> gRPC address
    delivery: DeliveryView

    def consumed_floor(self, entry: QueueEntry, partition: int, high: int) -> int:
        return self.delivery.consumed_floor(entry.queue_id, partition, high)
