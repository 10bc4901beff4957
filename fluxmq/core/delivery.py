"""Consumer groups: who has which message, per group and partition (DESIGN §2).

Per (group, partition) the state is a *committed* offset (everything below is done), a delivery
*frontier* ``next`` (offsets at or above it were never handed out), and between the two a slot
for every offset that is not done yet: LEASED (to a member, until a deadline) or SCHEDULED
(ready again at a time: a retry, an expired lease, a delayed message). An offset in
[committed, next) without a slot is done (acked, dead-lettered, filtered, purged), so the
committed offset is always the smallest slot, or ``next`` when there is none.

    committed            next               high watermark
        |  L  .  S  L  .  |  ready, never delivered  |

Every change is made while applying a command (time comes in the command) and is written to the
store in the same transaction; the in-memory indexes (heaps of due times and deadlines, counts
per member) are rebuilt from the stored rows on start, so a replica that restarts ends up with
exactly the same state. The owner (QueueStateMachine) reloads this state if a transaction aborts.

Slots are stored as *runs*: the maximal stretches of consecutive offsets whose slots are alike
(same kind, attempt, due time and member, lease ids counting up by one), one row each. A lease of
100 in-order records is one row, and acking them one row deleted; a row is rewritten only where a
command changed a slot or its neighbour. Runs are a function of the slots alone, so replicas that
applied the same commands store the same rows (their digests agree).

Delivery order in ``shared`` mode is by *ready time*: a never-delivered message is ready at its
publish time (or its delivery delay), a retry at its due time, an expired lease at its deadline.
So an expired lease goes behind the messages already waiting, as in Querator and SQS. In
``ordered`` mode a partition is handed to one consumer at a time and strictly in offset order:
while any of its messages is leased nobody gets the next batch, and a retry not yet due holds the
partition.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, limits
from fluxmq.core.errors import FluxError
from fluxmq.core.membership import Membership
from fluxmq.core.queue_config import QueuePolicy
from storage.api import PartitionLogReader, ReadTxn, Record, WriteTxn

NEW, LEASED, SCHEDULED = 0, 1, 2

DELIVER_AT_HEADER = "fluxmq-deliver-at"
REPLAY_GROUP_HEADER = "fluxmq-replay-group"

# Per-receipt outcomes (values of fluxmq.v1.ReceiptStatus).
ACKED = pb.RECEIPT_STATUS_ACKED
ALREADY_ACKED = pb.RECEIPT_STATUS_ALREADY_ACKED
UNKNOWN = pb.RECEIPT_STATUS_UNKNOWN
STALE = pb.RECEIPT_STATUS_STALE
NACKED = pb.RECEIPT_STATUS_NACKED
DEAD_LETTERED = pb.RECEIPT_STATUS_DEAD_LETTERED
EXTENDED = pb.RECEIPT_STATUS_EXTENDED

_READ_BYTES_MAX = 16 * 1024 * 1024


@dataclass(slots=True)
class Slot:
    kind: int
    attempt: int  # deliveries so far
    due_ms: int  # LEASED: lease deadline; SCHEDULED: ready time
    lease_id: int = 0
    member: str = ""


@dataclass(slots=True)
class PartState:
    committed: int
    next: int
    acked: int = 0
    dead: int = 0
    filtered: int = 0
    skipped: int = 0  # removed by retention (or gone) before this group was done with them
    purged: int = 0
    # The accounting origin: ``next - base`` offsets are done or pending for this group, so
    # ``next - base == acked + dead + filtered + skipped + purged + len(slots)`` always holds
    # (``check``; the audit checks it on disk). It starts at the group's start offset and moves
    # by what a reset skips (up) or rewinds (down), so it may go below 0.
    base: int = 0
    slots: dict[int, Slot] = field(default_factory=dict)
    ready: list[tuple[int, int]] = field(default_factory=list)  # heap (due_ms, offset), lazy
    leased: int = 0
    scheduled: int = 0
    # The runs as stored (written at flush): last offset -> first offset, and offset -> the
    # last offset of its run, to find the rows a changed slot belongs to.
    runs: dict[int, int] = field(default_factory=dict)
    run_of: dict[int, int] = field(default_factory=dict)

    def pack(self) -> bytes:
        return keys.PARTITION_VALUE.pack(
            self.committed,
            self.next,
            self.acked,
            self.dead,
            self.filtered,
            self.skipped,
            self.purged,
            self.base,
        )

    def check(self) -> None:
        """The partition row's invariants: what is done or pending is exactly [base, next)."""
        assert self.committed <= self.next, (self.committed, self.next)
        done = self.acked + self.dead + self.filtered + self.skipped + self.purged
        assert self.next - self.base == done + len(self.slots), (
            self.next,
            self.base,
            done,
            len(self.slots),
        )


@dataclass(frozen=True, slots=True)
class Checkout:
    """A consumer checked out of its group by a Consume stream (replicated state): while it
    is, applies assign it ready messages up to its credit (``max_in_flight`` minus what it
    holds), and the leader pushes them on the stream of ``session_id``."""

    consumer_id: str
    max_in_flight: int
    lease_ms: int
    session_id: int
    member: cpb.MemberRef

    def to_proto(self) -> cpb.CheckoutState:
        return cpb.CheckoutState(
            consumer_id=self.consumer_id,
            max_in_flight=self.max_in_flight,
            lease_ms=self.lease_ms,
            session_id=self.session_id,
            member=self.member,
        )

    @classmethod
    def from_proto(cls, m: cpb.CheckoutState) -> Checkout:
        member = cpb.MemberRef()
        member.CopyFrom(m.member)
        return cls(m.consumer_id, m.max_in_flight, m.lease_ms, m.session_id, member)


@dataclass(slots=True)
class GroupState:
    meta: pb.Group
    queue_id: int
    parts: dict[int, PartState] = field(default_factory=dict)
    expiry: list[tuple[int, int, int, int]] = field(default_factory=list)  # (deadline, p, off, id)
    in_flight_by_member: dict[str, int] = field(default_factory=dict)
    membership: Membership | None = None  # None until somebody joins
    checkouts: dict[str, Checkout] = field(default_factory=dict)  # consumer id -> checkout
    group_id: int = field(init=False)  # meta's, read on every grant and ack: kept as a plain int

    def __post_init__(self) -> None:
        self.group_id = int(self.meta.group_id)

    @property
    def name(self) -> str:
        return str(self.meta.name)

    @property
    def ordered(self) -> bool:
        return bool(self.meta.mode == pb.DELIVERY_MODE_ORDERED)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One leased message: what the consumer gets."""

    partition: int
    record: Record
    attempt: int
    deadline_ms: int
    lease_id: int


@dataclass(frozen=True, slots=True)
class Push:
    """What an apply assigned to a checked-out consumer, for the leader to send on the stream
    of ``session_id`` (followers assign the same and send nothing). With ``error`` the checkout
    was revoked (its member is no longer current): the stream ends with that error; with
    ``end`` the consumer was checked in: the stream ends after what was pushed before."""

    group_id: int
    consumer_id: str
    session_id: int
    deliveries: tuple[Delivery, ...] = ()
    error: FluxError | None = None
    end: bool = False


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that must go to the dead-letter queue (written by the state machine)."""

    queue_id: int
    group: str
    partition: int
    record: Record
    attempts: int
    reason: str


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A copy of one group partition's state, for admin reads and tests."""

    partition: int
    committed: int
    next: int
    acked: int
    dead: int
    filtered: int
    skipped: int
    purged: int
    leased: dict[int, tuple[str, int, int, int]]  # offset -> (member, lease_id, attempt, deadline)
    scheduled: dict[int, tuple[int, int]]  # offset -> (due_ms, attempt)


def group_not_found(queue: str, group: str) -> FluxError:
    return FluxError(
        "GROUP_NOT_FOUND",
        f"queue {queue!r} has no consumer group {group!r} (create it with CreateGroup)",
        metadata={"queue": queue, "group": group},
    )


def header(record: Record, name: str) -> bytes | None:
    for key, value in record.headers:
        if key == name:
            return value
    return None


def matches(meta: pb.Group, record: Record) -> bool:
    """Whether ``record`` is for group ``meta``: its filter, and replays aimed at one group."""
    aimed = header(record, REPLAY_GROUP_HEADER)
    if aimed is not None and aimed.decode() != meta.name:
        return False
    f = meta.filter
    if f.HasField("key_prefix") and (record.key is None or not record.key.startswith(f.key_prefix)):
        return False
    return all(header(record, name) == value for name, value in f.header_equals.items())


def ready_at_ms(record: Record, policy: QueuePolicy) -> int:
    """When a never-delivered record becomes visible to groups."""
    at = header(record, DELIVER_AT_HEADER)
    if at is not None:
        return int(at)
    return record.timestamp_ms + policy.delivery_delay_ms


def expired(record: Record, policy: QueuePolicy, now_ms: int) -> bool:
    return bool(policy.message_ttl_ms) and now_ms - record.timestamp_ms >= policy.message_ttl_ms


class DeliveryState:
    """Every consumer group of one store. Mutated only by the applying thread."""

    def __init__(self) -> None:
        self.groups: dict[int, dict[str, GroupState]] = {}  # queue_id -> name -> group
        self._by_id: dict[int, GroupState] = {}
        self._dirty: set[tuple[int, int]] = set()  # (group_id, partition) with a changed row
        # (group_id, partition) -> offsets whose slot changed since the last flush
        self._slots_dirty: dict[tuple[int, int], set[int]] = {}
        self.legacy_slot_keys: list[bytes] = []  # per-offset rows of an older store (keys.SLOT)
        self.dead_letters: list[DeadLetter] = []  # to be written by the state machine
        self.touched: set[int] = set()  # group ids changed since the owner last looked
        # Of those, the groups whose membership was saved: the others' published membership
        # copies stay valid (a membership changes only through save_membership).
        self.members_touched: set[int] = set()
        # The groups the current command changed (cleared after each command): where its
        # apply may have made messages ready or freed credit, so where checkouts are served.
        self.changed: set[int] = set()
        self.checked_out: set[int] = set()  # ids of the groups with a checkout
        self.pushes: list[Push] = []  # what this batch assigned to checkouts, for the leader
        self._next_lease_id = 1

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, txn: ReadTxn) -> DeliveryState:
        state = cls()
        raw = txn.get(keys.NEXT_LEASE_ID)
        state._next_lease_id = keys.U64.unpack(raw)[0] if raw else 1
        for key, value in txn.scan(keys.GROUP):
            meta = pb.Group.FromString(value)
            queue_id = keys.U64.unpack_from(key, len(keys.GROUP))[0]
            g = GroupState(meta, queue_id)
            state.groups.setdefault(queue_id, {})[g.name] = g
            state._by_id[g.group_id] = g
        for key, value in txn.scan(keys.GROUP_PARTITION):
            group_id = keys.U64.unpack_from(key, len(keys.GROUP_PARTITION))[0]
            partition = keys.U32.unpack_from(key, len(keys.GROUP_PARTITION) + 8)[0]
            committed, nxt, acked, dead, filtered, skipped, purged, base = (
                keys.PARTITION_VALUE.unpack(value)
            )
            assert committed <= nxt, (group_id, partition, committed, nxt)
            state._by_id[group_id].parts[partition] = PartState(
                committed, nxt, acked, dead, filtered, skipped, purged, base
            )
        for key, value in txn.scan(keys.SLOT_RUN):
            group_id, partition, last = keys.split_slot_key(key)
            kind, attempt, due_ms, lease_id, first = keys.SLOT_RUN_VALUE.unpack_from(value)
            member = value[keys.SLOT_RUN_VALUE.size :].decode()
            g = state._by_id[group_id]
            part = g.parts[partition]
            assert kind in (LEASED, SCHEDULED), (group_id, partition, last, kind)
            assert part.committed <= first <= last < part.next, (group_id, partition, first, last)
            step = 1 if kind == LEASED else 0
            part.runs[last] = first
            for i in range(last - first + 1):
                offset = first + i
                assert offset not in part.slots, (group_id, partition, offset)
                slot = Slot(kind, attempt, due_ms, lease_id + step * i, member)
                part.slots[offset] = slot
                part.run_of[offset] = last
                state._index(g, partition, part, offset, slot)
        for key, value in txn.scan(keys.SLOT):
            # A store written before runs: its slots become runs at the owner's next flush
            # (QueueStateMachine rewrites them when it opens the store).
            group_id, partition, offset = keys.split_slot_key(key)
            kind, attempt, due_ms, lease_id = keys.SLOT_VALUE.unpack_from(value)
            member = value[keys.SLOT_VALUE.size :].decode()
            g = state._by_id[group_id]
            part = g.parts[partition]
            assert part.committed <= offset < part.next, (group_id, partition, offset)
            assert offset not in part.slots, (group_id, partition, offset)
            slot = Slot(kind, attempt, due_ms, lease_id, member)
            part.slots[offset] = slot
            state._index(g, partition, part, offset, slot)
            state.legacy_slot_keys.append(key)
            state._slots_dirty.setdefault((group_id, partition), set()).add(offset)
        for key, value in txn.scan(keys.CHECKOUT):
            group_id = keys.U64.unpack_from(key, len(keys.CHECKOUT))[0]
            co = Checkout.from_proto(cpb.CheckoutState.FromString(value))
            assert key == keys.checkout_key(group_id, co.consumer_id), key
            state._by_id[group_id].checkouts[co.consumer_id] = co
            state.checked_out.add(group_id)
        for key, value in txn.scan(keys.MEMBERSHIP):
            group_id = keys.U64.unpack_from(key, len(keys.MEMBERSHIP))[0]
            ms = Membership.from_proto(cpb.MembershipState.FromString(value))
            state._by_id[group_id].membership = ms
        for g in state._by_id.values():
            heapq.heapify(g.expiry)
            for part in g.parts.values():
                part.check()
                heapq.heapify(part.ready)
        return state

    def _index(self, g: GroupState, partition: int, part: PartState, offset: int, s: Slot) -> None:
        if s.kind == LEASED:
            part.leased += 1
            g.expiry.append((s.due_ms, partition, offset, s.lease_id))
            g.in_flight_by_member[s.member] = g.in_flight_by_member.get(s.member, 0) + 1
        elif s.kind == SCHEDULED:
            part.scheduled += 1
            part.ready.append((s.due_ms, offset))

    # -- persistence helpers -----------------------------------------------------------------

    def flush(self, txn: WriteTxn) -> None:
        """Write the rows changed since the last flush: slot runs, then partition rows."""
        for key in self.legacy_slot_keys:
            txn.delete(key)
        self.legacy_slot_keys.clear()
        for (group_id, partition), offsets in sorted(self._slots_dirty.items()):
            g = self._by_id.get(group_id)
            if g is not None:
                self._write_runs(txn, group_id, partition, g.parts[partition], offsets)
        self._slots_dirty.clear()
        for group_id, partition in self._dirty:
            g = self._by_id.get(group_id)
            if g is None:
                continue
            part = g.parts[partition]
            part.check()
            txn.put(keys.group_partition_key(group_id, partition), part.pack())
        self._dirty.clear()

    @staticmethod
    def _write_runs(
        txn: WriteTxn, group_id: int, p: int, part: PartState, changed: set[int]
    ) -> None:
        """Rewrite the runs that hold a changed offset or border one (a change may split a run
        or join two). Runs elsewhere stay as stored: the border between two unchanged slots is
        unchanged, so every new run lies within the rows replaced."""
        slots, runs, run_of = part.slots, part.runs, part.run_of
        put: dict[int, int] = {}  # last -> first: rows to write
        gone: set[int] = set()  # last offsets of rows to delete (unless written again)
        present = []
        # Offsets that are done (acked, dead...) only cut their run: what is left of it on
        # either side is still maximal. Acks in order cut runs at their front: O(1) each.
        for o in sorted(changed):
            if o in slots:
                present.append(o)
                continue
            last = run_of.pop(o, None)
            if last is None:
                continue
            first = runs.pop(last)
            gone.add(last)
            put.pop(last, None)
            if first < o:
                runs[o - 1] = put[o - 1] = first
                for x in range(first, o):
                    run_of[x] = o - 1
            if o < last:
                runs[last] = put[last] = o + 1
        if present:
            DeliveryState._rejoin_runs(part, present, put, gone)
        for last in gone - put.keys():
            txn.delete(keys.slot_run_key(group_id, p, last))
        for last, first in put.items():
            s = slots[first]
            assert runs.get(last) == first, (group_id, p, first, last)
            assert s.kind in (LEASED, SCHEDULED), (group_id, p, first, s)
            assert part.committed <= first <= last < part.next, (group_id, p, first, last)
            txn.put(
                keys.slot_run_key(group_id, p, last),
                keys.SLOT_RUN_VALUE.pack(s.kind, s.attempt, s.due_ms, s.lease_id, first)
                + s.member.encode(),
            )

    @staticmethod
    def _rejoin_runs(
        part: PartState, changed: list[int], put: dict[int, int], gone: set[int]
    ) -> None:
        """Replace the stored runs holding or bordering ``changed`` (sorted offsets with a slot
        that was set or changed) by the maximal runs of the slots there; record the rows in ``put``
        and ``gone``."""
        slots, runs, run_of = part.slots, part.runs, part.run_of
        old: dict[int, int] = {}  # last -> first, of the stored runs replaced
        for o in changed:
            for x in (o - 1, o, o + 1):
                last = run_of.get(x)
                if last is not None and last not in old:
                    old[last] = runs[last]
        # Rows as stored on disk (not already cut in this flush): one that comes out the same
        # is left alone.
        as_stored = {last: first for last, first in old.items() if last not in gone}
        points = set(changed)
        for last, first in old.items():
            points.update(range(first, last + 1))
            del runs[last]
            for x in range(first, last + 1):
                del run_of[x]
            gone.add(last)
            put.pop(last, None)
        for x in sorted(points):
            if x not in slots or x in run_of:
                continue
            first = last = x
            while first - 1 in slots and _alike(slots[first - 1], slots[first]):
                first -= 1
            while last + 1 in slots and _alike(slots[last], slots[last + 1]):
                last += 1
            runs[last] = first
            for y in range(first, last + 1):
                assert y not in run_of, y  # a run reached one not replaced
                run_of[y] = last
            at = bisect.bisect_left(changed, first)  # ``changed`` is sorted
            if as_stored.get(last) == first and not (at < len(changed) and changed[at] <= last):
                gone.discard(last)  # the same offsets, none of them changed: the row stays
            else:
                put[last] = first

    def _slot_changed(self, g: GroupState, p: int, offset: int) -> None:
        """The slot of ``offset`` was set, changed or removed: its run is rewritten at flush."""
        key = (g.group_id, p)
        dirty = self._slots_dirty.get(key)
        if dirty is None:
            dirty = self._slots_dirty[key] = set()
        dirty.add(offset)

    def _touch(self, g: GroupState, p: int) -> None:
        self._dirty.add((g.group_id, p))
        self._mark(g.group_id)

    def _mark(self, group_id: int) -> None:
        self.touched.add(group_id)
        self.changed.add(group_id)

    # -- groups -----------------------------------------------------------------------------

    def get(self, queue_id: int, queue: str, name: str) -> GroupState:
        g = self.groups.get(queue_id, {}).get(name)
        if g is None:
            raise group_not_found(queue, name)
        return g

    def all_groups(self) -> list[GroupState]:
        return [self._by_id[k] for k in sorted(self._by_id)]

    def by_id(self, group_id: int) -> GroupState | None:
        return self._by_id.get(group_id)

    def of_queue(self, queue_id: int) -> list[GroupState]:
        return sorted(self.groups.get(queue_id, {}).values(), key=lambda g: g.group_id)

    def create(
        self,
        txn: WriteTxn,
        queue_id: int,
        meta: pb.Group,
        start_offsets: dict[int, int],
    ) -> GroupState:
        named = self.groups.setdefault(queue_id, {})
        if meta.name in named:
            raise FluxError(
                "GROUP_EXISTS",
                f"queue {meta.queue!r} already has a group {meta.name!r}",
                metadata={"queue": meta.queue, "group": meta.name},
            )
        if len(named) >= limits.GROUPS_PER_QUEUE_MAX:
            raise FluxError(
                "GROUP_LIMIT", f"a queue has at most {limits.GROUPS_PER_QUEUE_MAX} groups"
            )
        g = GroupState(meta, queue_id)
        named[g.name] = g
        self._by_id[g.group_id] = g
        self._mark(g.group_id)
        txn.put(keys.group_key(queue_id, g.name), meta.SerializeToString())
        for p, offset in start_offsets.items():
            g.parts[p] = PartState(offset, offset, base=offset)
            self._touch(g, p)
        return g

    def save_membership(self, txn: WriteTxn, g: GroupState) -> None:
        ms = g.membership
        assert ms is not None
        ms.check()
        txn.put(keys.membership_key(g.group_id), ms.to_proto().SerializeToString())
        self._mark(g.group_id)
        self.members_touched.add(g.group_id)

    # -- checkouts --------------------------------------------------------------------------

    def checkout(self, txn: WriteTxn, g: GroupState, co: Checkout) -> None:
        """Check ``co.consumer_id`` out (replacing its earlier checkout, if any)."""
        if co.consumer_id not in g.checkouts and len(g.checkouts) >= limits.CHECKOUTS_PER_GROUP_MAX:
            raise FluxError(
                "CHECKOUT_LIMIT",
                f"group {g.name!r} has {limits.CHECKOUTS_PER_GROUP_MAX} Consume streams open, "
                "the most it takes: close one, or lease with Lease",
                retriable=True,
                retry_after_ms=1000,
                metadata={"group": g.name},
            )
        assert co.session_id > 0 and co.max_in_flight > 0, co
        g.checkouts[co.consumer_id] = co
        self.checked_out.add(g.group_id)
        txn.put(keys.checkout_key(g.group_id, co.consumer_id), co.to_proto().SerializeToString())
        self._mark(g.group_id)

    def checkin(self, txn: WriteTxn, g: GroupState, consumer_id: str, session_id: int) -> bool:
        """End the checkout of ``consumer_id`` if it is still the one of ``session_id`` (0: any).
        -> whether one ended. The consumer's leases stay as they are."""
        co = g.checkouts.get(consumer_id)
        if co is None or (session_id and co.session_id != session_id):
            return False
        del g.checkouts[consumer_id]
        if not g.checkouts:
            self.checked_out.discard(g.group_id)
        txn.delete(keys.checkout_key(g.group_id, consumer_id))
        self._mark(g.group_id)
        return True

    def busy(self, g: GroupState, p: int) -> bool:
        """Whether a partition of an ordered group still has a batch out (it cannot move)."""
        part = g.parts.get(p)
        return part is not None and part.leased > 0

    def expire_member_leases(self, txn: WriteTxn, g: GroupState, member: str, now_ms: int) -> int:
        """The member is gone: its leases end now, so the next ExpireLeases pass hands their
        messages out again (with the attempt counted, as for any expired lease)."""
        count = 0
        for p in sorted(g.parts):
            part = g.parts[p]
            if not part.leased:
                continue
            for offset, slot in sorted(part.slots.items()):
                if slot.kind == LEASED and slot.member == member and slot.due_ms > now_ms:
                    slot.due_ms = now_ms
                    heapq.heappush(g.expiry, (now_ms, p, offset, slot.lease_id))
                    self._slot_changed(g, p, offset)
                    count += 1
        if count:
            self._mark(g.group_id)
        return count

    def delete(self, txn: WriteTxn, g: GroupState) -> None:
        txn.delete(keys.group_key(g.queue_id, g.name))
        if g.membership is not None:
            txn.delete(keys.membership_key(g.group_id))
        for p, part in g.parts.items():
            for last in part.runs:
                txn.delete(keys.slot_run_key(g.group_id, p, last))
            self._slots_dirty.pop((g.group_id, p), None)
            txn.delete(keys.group_partition_key(g.group_id, p))
        for consumer_id in g.checkouts:
            txn.delete(keys.checkout_key(g.group_id, consumer_id))
        self.checked_out.discard(g.group_id)
        del self.groups[g.queue_id][g.name]
        del self._by_id[g.group_id]
        self._mark(g.group_id)

    def delete_queue(self, txn: WriteTxn, queue_id: int) -> None:
        for g in self.of_queue(queue_id):
            self.delete(txn, g)
        self.groups.pop(queue_id, None)

    def _part(self, g: GroupState, p: int) -> PartState:
        part = g.parts.get(p)
        if part is None:  # a partition added after the group was created: read from its start
            part = g.parts[p] = PartState(0, 0)
            self._touch(g, p)
        return part

    # -- lease ------------------------------------------------------------------------------

    def lease(
        self,
        txn: WriteTxn,
        g: GroupState,
        policy: QueuePolicy,
        member: str,
        max_messages: int,
        lease_ms: int,
        now_ms: int,
        only: set[int] | None = None,
    ) -> list[Delivery]:
        """``only``: the partitions the member owns (ordered groups with members)."""
        out: list[Delivery] = []
        nparts = policy.partitions
        scan = [limits.LEASE_SCAN_RECORDS_MAX]
        # Rotate the first partition so that every partition gets its turn.
        first = self._next_lease_id % nparts
        for k in range(nparts):
            if len(out) >= max_messages:
                break
            p = (first + k) % nparts
            if only is not None and p not in only:
                continue
            part = self._part(g, p)
            if g.ordered and part.leased:
                continue  # held by whoever leased its last batch
            log = txn.log(keys.log_id(g.queue_id, p))
            self.catch_up(txn, g, p, log.watermarks().low)
            ctx = _Take(self, txn, g, p, part, log, policy, member, lease_ms, now_ms, out, scan)
            if g.ordered:
                ctx.take_ordered(max_messages - len(out))
            else:
                ctx.take_shared(max_messages - len(out))
        return out

    def _grant(
        self,
        txn: WriteTxn,
        g: GroupState,
        p: int,
        part: PartState,
        offset: int,
        slot: Slot,
        member: str,
        lease_ms: int,
        now_ms: int,
    ) -> None:
        if slot.kind == SCHEDULED:
            part.scheduled -= 1
        assert slot.kind != LEASED, (g.name, p, offset)
        slot.kind = LEASED
        slot.attempt += 1
        slot.due_ms = now_ms + lease_ms
        slot.lease_id = self._next_lease_id
        slot.member = member
        self._next_lease_id += 1
        part.slots[offset] = slot
        part.leased += 1
        heapq.heappush(g.expiry, (slot.due_ms, p, offset, slot.lease_id))
        g.in_flight_by_member[member] = g.in_flight_by_member.get(member, 0) + 1
        self._slot_changed(g, p, offset)
        self._touch(g, p)

    @property
    def rotation(self) -> int:
        """A number that moves with every lease granted (replicated): whose turn is first."""
        return self._next_lease_id

    def save_lease_counter(self, txn: WriteTxn) -> None:
        txn.put(keys.NEXT_LEASE_ID, keys.U64.pack(self._next_lease_id))

    # -- resolution -------------------------------------------------------------------------

    def _release(self, g: GroupState, part: PartState, slot: Slot) -> None:
        """Forget ``slot``'s membership in the leased/scheduled counts."""
        if slot.kind == LEASED:
            part.leased -= 1
            left = g.in_flight_by_member.get(slot.member, 0) - 1
            if left > 0:
                g.in_flight_by_member[slot.member] = left
            else:
                g.in_flight_by_member.pop(slot.member, None)
        elif slot.kind == SCHEDULED:
            part.scheduled -= 1

    def _resolve(
        self, txn: WriteTxn, g: GroupState, p: int, part: PartState, offset: int, slot: Slot
    ) -> None:
        """``offset`` (in [committed, next)) is done for this group."""
        self._release(g, part, slot)
        del part.slots[offset]
        self._slot_changed(g, p, offset)
        if offset == part.committed:
            self._advance(part)
        self._touch(g, p)

    @staticmethod
    def _advance(part: PartState) -> None:
        """Move the committed offset up to the smallest offset not done."""
        slots = part.slots
        for _ in range(64):  # the common case: the next slot is close
            if part.committed >= part.next or part.committed in slots:
                return
            part.committed += 1
        part.committed = min(slots, default=part.next)

    def _frontier_done(self, txn: WriteTxn, g: GroupState, p: int, part: PartState) -> None:
        """The record at the frontier is done without ever being leased (filtered, expired)."""
        if part.committed == part.next:
            part.committed += 1
        part.next += 1
        self._touch(g, p)

    def _dead(
        self,
        txn: WriteTxn,
        g: GroupState,
        p: int,
        part: PartState,
        record: Record,
        attempts: int,
        reason: str,
        slot: Slot | None,
    ) -> None:
        part.dead += 1
        self.dead_letters.append(DeadLetter(g.queue_id, g.name, p, record, attempts, reason))
        if slot is None:
            self._frontier_done(txn, g, p, part)
        else:
            self._resolve(txn, g, p, part, record.offset, slot)

    def catch_up(self, txn: WriteTxn, g: GroupState, p: int, low: int) -> None:
        """Retention removed records below ``low``: the group skips what it had not got to."""
        part = self._part(g, p)
        if part.next < low:
            part.skipped += low - part.next
            part.next = low
            self._touch(g, p)
        if part.committed >= low:
            return
        for offset in sorted(o for o in part.slots if o < low):
            s = part.slots[offset]
            if s.kind == LEASED:
                continue  # the consumer has the message; its ack still counts
            part.skipped += 1
            self._release(g, part, s)
            del part.slots[offset]
            self._slot_changed(g, p, offset)
        part.committed = min(part.slots, default=part.next)
        self._touch(g, p)

    # -- settle: ack, nack, extend ----------------------------------------------------------

    def _held(
        self, g: GroupState, receipt: pb.Receipt
    ) -> tuple[PartState | None, Slot | None, int]:
        """-> (partition state, slot, status if not held by this receipt else 0)."""
        part = g.parts.get(receipt.partition)
        if part is None:
            return None, None, UNKNOWN
        slot = part.slots.get(receipt.offset)
        if slot is None:
            if receipt.offset < part.next:
                return part, None, ALREADY_ACKED
            # Beyond the frontier yet leased once (the lease id was issued): offsets were reset
            # back over it, which dropped the lease.
            issued = 0 < receipt.lease_id < self._next_lease_id
            return part, None, STALE if issued else UNKNOWN
        if slot.kind != LEASED or slot.lease_id != receipt.lease_id:
            return part, slot, STALE
        return part, slot, 0

    def check_held(self, g: GroupState, receipts: Iterable[pb.Receipt]) -> list[int]:
        """Statuses an ack would get, without changing anything (0 = would be ACKED)."""
        return [self._held(g, r)[2] for r in receipts]

    def ack(self, txn: WriteTxn, g: GroupState, receipts: Iterable[pb.Receipt]) -> list[int]:
        statuses = []
        for r in receipts:
            part, slot, status = self._held(g, r)
            if status == 0:
                assert part is not None and slot is not None
                part.acked += 1
                self._resolve(txn, g, r.partition, part, r.offset, slot)
                status = ACKED
            statuses.append(status)
        return statuses

    def nack(
        self,
        txn: WriteTxn,
        g: GroupState,
        policy: QueuePolicy,
        receipts: Iterable[pb.Receipt],
        now_ms: int,
        retry_at_ms: int,
        dead: bool,
        reason: str,
    ) -> list[int]:
        statuses = []
        for r in receipts:
            part, slot, status = self._held(g, r)
            if status:
                statuses.append(status)
                continue
            assert part is not None and slot is not None
            give_up = policy.max_attempts and slot.attempt >= policy.max_attempts
            if dead or give_up:
                record = self._record(txn, g, r.partition, r.offset)
                if record is None:
                    part.skipped += 1
                    self._resolve(txn, g, r.partition, part, r.offset, slot)
                else:
                    why = (reason or "nacked") if dead else "max_attempts"
                    self._dead(txn, g, r.partition, part, record, slot.attempt, why, slot)
                statuses.append(DEAD_LETTERED)
                continue
            due = retry_at_ms or now_ms + policy.retry_delay_ms(slot.attempt)
            self._reschedule(txn, g, r.partition, part, r.offset, slot, due)
            statuses.append(NACKED)
        return statuses

    def _reschedule(
        self,
        txn: WriteTxn,
        g: GroupState,
        p: int,
        part: PartState,
        offset: int,
        slot: Slot,
        due: int,
    ) -> None:
        if offset < txn.log(keys.log_id(g.queue_id, p)).watermarks().low:
            # Retention removed it while it was leased (catch_up keeps leases): nothing is left
            # to deliver again. Skipped now, so that no scheduled slot is ever below the low
            # watermark: one would hold an ordered partition (and fool maybe_ready) until due.
            part.skipped += 1
            self._resolve(txn, g, p, part, offset, slot)
            return
        self._release(g, part, slot)
        slot.kind, slot.due_ms, slot.lease_id, slot.member = SCHEDULED, due, 0, ""
        part.scheduled += 1
        heapq.heappush(part.ready, (due, offset))
        _prune_ready(part)
        self._slot_changed(g, p, offset)
        self._touch(g, p)

    def extend(
        self,
        txn: WriteTxn,
        g: GroupState,
        receipts: Iterable[pb.Receipt],
        now_ms: int,
        lease_ms: int,
    ) -> list[tuple[int, int]]:
        out = []
        for r in receipts:
            _part, slot, status = self._held(g, r)
            if status:
                out.append((status, 0))
                continue
            assert slot is not None
            slot.due_ms = now_ms + lease_ms
            heapq.heappush(g.expiry, (slot.due_ms, r.partition, r.offset, slot.lease_id))
            self._slot_changed(g, r.partition, r.offset)
            self._mark(g.group_id)
            out.append((EXTENDED, slot.due_ms))
        return out

    def _record(self, txn: ReadTxn, g: GroupState, p: int, offset: int) -> Record | None:
        log = txn.log(keys.log_id(g.queue_id, p))
        if offset < log.watermarks().low:
            return None
        return log.read(offset, 1, _READ_BYTES_MAX)[0]

    # -- timers: lease expiry and TTL --------------------------------------------------------

    def expire(
        self, txn: WriteTxn, policies: dict[int, QueuePolicy], now_ms: int
    ) -> tuple[int, int]:
        """Expired leases go back (or to the DLQ past max_attempts); undelivered messages past
        their TTL go to the DLQ. -> (leases expired, messages expired by TTL)."""
        budget = limits.EXPIRIES_PER_PASS_MAX
        leases = ttl = 0
        for group_id in sorted(self._by_id):
            g = self._by_id[group_id]
            policy = policies.get(g.queue_id)
            if policy is None:
                continue
            head = g.expiry[0] if g.expiry else None
            while g.expiry and g.expiry[0][0] <= now_ms and budget > 0:
                deadline, p, offset, lease_id = heapq.heappop(g.expiry)
                part = g.parts.get(p)
                slot = part.slots.get(offset) if part is not None else None
                if (
                    part is None
                    or slot is None
                    or slot.kind != LEASED
                    or slot.lease_id != lease_id
                    or slot.due_ms != deadline
                ):
                    continue  # acked, extended or reset since: a stale heap entry
                budget -= 1
                leases += 1
                if policy.max_attempts and slot.attempt >= policy.max_attempts:
                    record = self._record(txn, g, p, offset)
                    if record is None:
                        part.skipped += 1
                        self._resolve(txn, g, p, part, offset, slot)
                    else:
                        self._dead(txn, g, p, part, record, slot.attempt, "max_attempts", slot)
                else:
                    # Ready again from its deadline: behind what was already waiting.
                    self._reschedule(txn, g, p, part, offset, slot, deadline)
            if (g.expiry[0] if g.expiry else None) != head:
                self._mark(g.group_id)  # stale entries went: published views must see it
            if policy.message_ttl_ms and budget > 0:
                for p in range(policy.partitions):
                    examined, dead = self._expire_ttl(txn, g, p, policy, now_ms, budget)
                    ttl += dead
                    budget -= examined
        return leases, ttl

    def _expire_ttl(
        self, txn: WriteTxn, g: GroupState, p: int, policy: QueuePolicy, now_ms: int, budget: int
    ) -> tuple[int, int]:
        """-> (records passed, of which dead-lettered). Expired records that are not for this
        group are passed as filtered: they cost budget but were not expired *for* the group."""
        part = self._part(g, p)
        log = txn.log(keys.log_id(g.queue_id, p))
        wm = log.watermarks()
        self.catch_up(txn, g, p, wm.low)
        done = dead = 0
        while done < budget and part.next < wm.high:
            records = log.read(part.next, min(1000, budget - done), _READ_BYTES_MAX)
            for record in records:
                if not expired(record, policy, now_ms):
                    return done, dead  # timestamps do not decrease along a log
                if matches(g.meta, record):
                    self._dead(txn, g, p, part, record, 0, "ttl", None)
                    dead += 1
                else:
                    part.filtered += 1
                    self._frontier_done(txn, g, p, part)
                done += 1
        return done, dead

    # -- offsets ----------------------------------------------------------------------------

    def reset(self, txn: WriteTxn, g: GroupState, p: int, offset: int) -> None:
        """Delivery of partition ``p`` starts again at ``offset``; leases and retries go."""
        part = self._part(g, p)
        part.base += offset - part.next + len(part.slots)
        for o, s in list(part.slots.items()):
            self._release(g, part, s)
            self._slot_changed(g, p, o)
        part.slots.clear()
        part.ready.clear()
        part.committed = part.next = offset
        self._touch(g, p)

    # -- purge ------------------------------------------------------------------------------

    def purge(
        self,
        txn: WriteTxn,
        g: GroupState,
        policy: QueuePolicy,
        scope: int,
        destructive: bool,
        now_ms: int,
    ) -> int:
        """Querator's clear for one group. -> deliveries dropped."""
        ready = scope in (pb.PURGE_SCOPE_READY, pb.PURGE_SCOPE_ALL, pb.PURGE_SCOPE_UNSPECIFIED)
        scheduled = scope in (
            pb.PURGE_SCOPE_SCHEDULED,
            pb.PURGE_SCOPE_ALL,
            pb.PURGE_SCOPE_UNSPECIFIED,
        )
        dropped = 0
        for p in range(policy.partitions):
            part = self._part(g, p)
            log = txn.log(keys.log_id(g.queue_id, p))
            wm = log.watermarks()
            self.catch_up(txn, g, p, wm.low)
            for offset in sorted(part.slots):
                s = part.slots[offset]
                drop = (
                    (s.kind == LEASED and destructive)
                    or (s.kind == SCHEDULED and s.due_ms <= now_ms and ready)
                    or (s.kind == SCHEDULED and s.due_ms > now_ms and scheduled)
                )
                if drop:
                    part.purged += 1
                    dropped += 1
                    self._resolve(txn, g, p, part, offset, s)
            if ready and scheduled and part.next < wm.high:
                n = wm.high - part.next
                part.purged += n
                dropped += n
                part.next = wm.high
                self._advance(part)
                self._touch(g, p)
            elif part.next < wm.high:
                # One scope only: never-delivered records are ready or delayed one by one (a
                # message may carry its own delay), so each must be looked at.
                dropped += self._purge_frontier(
                    txn, g, p, part, log, wm.high, policy, ready, now_ms
                )
            _prune_ready(part)
        return dropped

    def _purge_frontier(
        self,
        txn: WriteTxn,
        g: GroupState,
        p: int,
        part: PartState,
        log: PartitionLogReader,
        high: int,
        policy: QueuePolicy,
        drop_ready: bool,
        now_ms: int,
    ) -> int:
        """Purge the never-delivered records of partition ``p`` that are ready now
        (``drop_ready``) or those that are delayed (not ``drop_ready``). The frontier moves past
        both, so a record that stays becomes a scheduled slot at its ready time. Bounded like a
        lease walk: at PENDING_PER_PARTITION_MAX slots the rest of the frontier is left alone.
        -> records dropped."""
        dropped = 0
        while part.next < high and len(part.slots) < limits.PENDING_PER_PARTITION_MAX:
            for record in log.read(part.next, min(1000, high - part.next), _READ_BYTES_MAX):
                assert record.offset == part.next, (record.offset, part.next)
                if len(part.slots) >= limits.PENDING_PER_PARTITION_MAX:
                    break
                if not matches(g.meta, record):
                    part.filtered += 1
                    self._frontier_done(txn, g, p, part)
                    continue
                due = ready_at_ms(record, policy)
                if (due <= now_ms) == drop_ready:
                    part.purged += 1
                    dropped += 1
                    self._frontier_done(txn, g, p, part)
                else:
                    self._schedule_frontier(txn, g, p, part, due)
        return dropped

    def _schedule_frontier(
        self, txn: WriteTxn, g: GroupState, p: int, part: PartState, due: int
    ) -> None:
        """The record at the frontier waits, as a never-delivered scheduled slot, until ``due``."""
        offset = part.next
        part.next += 1
        part.slots[offset] = Slot(SCHEDULED, 0, due)
        part.scheduled += 1
        heapq.heappush(part.ready, (due, offset))
        self._slot_changed(g, p, offset)
        self._touch(g, p)

    # -- reads ------------------------------------------------------------------------------

    def view(self, g: GroupState, p: int) -> PartitionView:
        part = g.parts.get(p) or PartState(0, 0)
        return PartitionView(
            partition=p,
            committed=part.committed,
            next=part.next,
            acked=part.acked,
            dead=part.dead,
            filtered=part.filtered,
            skipped=part.skipped,
            purged=part.purged,
            leased={
                o: (s.member, s.lease_id, s.attempt, s.due_ms)
                for o, s in part.slots.items()
                if s.kind == LEASED
            },
            scheduled={
                o: (s.due_ms, s.attempt) for o, s in part.slots.items() if s.kind == SCHEDULED
            },
        )

    def iter_groups(self) -> Iterator[GroupState]:
        return iter(list(self._by_id.values()))


def _alike(a: Slot, b: Slot) -> bool:
    """Whether ``b``, the slot of the offset after ``a``'s, is stored in the same run."""
    step = 1 if a.kind == LEASED else 0
    return (
        a.kind == b.kind
        and a.attempt == b.attempt
        and a.due_ms == b.due_ms
        and a.member == b.member
        and b.lease_id == a.lease_id + step
    )


def _prune_ready(part: PartState) -> None:
    """Rebuild the due-time heap when stale entries dominate it (bounded memory)."""
    if len(part.ready) > 2 * part.scheduled + 64:
        part.ready = [(s.due_ms, o) for o, s in part.slots.items() if s.kind == SCHEDULED]
        heapq.heapify(part.ready)


class _Take:
    """One Lease command's walk over one partition."""

    def __init__(
        self,
        state: DeliveryState,
        txn: WriteTxn,
        g: GroupState,
        p: int,
        part: PartState,
        log: PartitionLogReader,
        policy: QueuePolicy,
        member: str,
        lease_ms: int,
        now_ms: int,
        out: list[Delivery],
        scan: list[int],
    ) -> None:
        self.state, self.txn, self.g, self.p, self.part = state, txn, g, p, part
        self.log, self.policy, self.member = log, policy, member
        self.lease_ms, self.now_ms, self.out, self.scan = lease_ms, now_ms, out, scan
        self.high = log.watermarks().high
        self.buf: deque[Record] = deque()
        self.need = 1  # records still wanted by the current take (sizes the frontier reads)

    def _grant(self, offset: int, slot: Slot, record: Record) -> None:
        self.state._grant(
            self.txn,
            self.g,
            self.p,
            self.part,
            offset,
            slot,
            self.member,
            self.lease_ms,
            self.now_ms,
        )
        self.out.append(Delivery(self.p, record, slot.attempt, slot.due_ms, slot.lease_id))

    def _frontier(self, blocking_delay: bool) -> tuple[Record, int] | None:
        """The next frontier record that can be leased now, with its ready time. Records on the
        way that cannot (filtered, expired, delayed) are dealt with as they are passed; with
        ``blocking_delay`` a delayed record stops the walk (ordered mode)."""
        part, g = self.part, self.g
        while True:
            if not self.buf:
                if (
                    part.next >= self.high
                    or self.scan[0] <= 0
                    or len(part.slots) >= limits.PENDING_PER_PARTITION_MAX
                ):
                    return None
                # Read what is wanted plus a little (filtered or delayed records are skipped):
                # decoding is the cost of a lease, so never decode far past the need.
                want = min(self.need + 16, 1000, self.scan[0], self.high - part.next)
                self.buf.extend(self.log.read(part.next, want, _READ_BYTES_MAX))
                if not self.buf:
                    return None
            record = self.buf[0]
            assert record.offset == part.next, (record.offset, part.next)
            if not matches(g.meta, record):
                part.filtered += 1
                self.state._frontier_done(self.txn, g, self.p, part)
            elif expired(record, self.policy, self.now_ms):
                self.state._dead(self.txn, g, self.p, part, record, 0, "ttl", None)
            else:
                ready = ready_at_ms(record, self.policy)
                if ready <= self.now_ms:
                    return record, ready
                if blocking_delay:
                    # Ordered: the partition waits for this message; remember when it is due.
                    self._schedule_frontier(ready)
                    return None
                self._schedule_frontier(ready)
            self.buf.popleft()
            self.scan[0] -= 1

    def _schedule_frontier(self, due: int) -> None:
        self.state._schedule_frontier(self.txn, self.g, self.p, self.part, due)

    def _take_frontier(self, record: Record) -> None:
        self.buf.popleft()
        self.scan[0] -= 1
        offset = self.part.next
        self.part.next += 1
        self._grant(offset, Slot(NEW, 0, 0), record)

    def _take_scheduled(self, offset: int, slot: Slot) -> None:
        """Lease a due retry (or dead-letter it, or skip it if retention removed it)."""
        state, part = self.state, self.part
        record = state._record(self.txn, self.g, self.p, offset)
        if record is None:
            part.skipped += 1
            state._resolve(self.txn, self.g, self.p, part, offset, slot)
        elif expired(record, self.policy, self.now_ms):
            state._dead(self.txn, self.g, self.p, part, record, slot.attempt, "ttl", slot)
        else:
            self._grant(offset, slot, record)

    def _peek_due(self) -> tuple[int, int] | None:
        ready, slots = self.part.ready, self.part.slots
        while ready:
            due, offset = ready[0]
            s = slots.get(offset)
            if s is None or s.kind != SCHEDULED or s.due_ms != due:
                heapq.heappop(ready)  # stale
                continue
            return (due, offset) if due <= self.now_ms else None
        return None

    def take_shared(self, need: int) -> None:
        target = len(self.out) + need
        self.need = need
        while len(self.out) < target:
            due = self._peek_due()
            head = self._frontier(blocking_delay=False)
            if due is None and head is None:
                return
            if due is not None and (head is None or due[0] <= head[1]):
                heapq.heappop(self.part.ready)
                self._take_scheduled(due[1], self.part.slots[due[1]])
            else:
                assert head is not None
                self._take_frontier(head[0])

    def take_ordered(self, need: int) -> None:
        target = len(self.out) + need
        self.need = need
        part = self.part
        _prune_ready(part)
        for offset in sorted(o for o, s in part.slots.items() if s.kind == SCHEDULED):
            if len(self.out) >= target:
                return
            slot = part.slots[offset]
            if slot.due_ms > self.now_ms:
                return  # in order: nothing after it may go first
            self._take_scheduled(offset, slot)
        if any(s.kind == SCHEDULED for s in part.slots.values()):
            return
        while len(self.out) < target:
            head = self._frontier(blocking_delay=True)
            if head is None:
                return
            self._take_frontier(head[0])
