"""The queue state machine: applies commands, in log order, to one store.

Deterministic and clock-free: every time it needs comes inside the command (``now_ms``, stamped
by the leader). A run of entries is applied in one write transaction (group commit: one fsync),
and the last applied index is written in that same transaction, so replaying entries that were
already applied changes nothing.

A command that is refused (queue not found, ...) is a *result*, not an exception: the refusal is
as deterministic as a success and must not abort the other commands of the same transaction.
An exception from storage aborts the whole transaction; nothing of the batch is applied.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import dead_letters as dls
from fluxmq.core import keys, limits, producers
from fluxmq.core import membership as msh
from fluxmq.core.catalog import QueueEntry, dead_letter_entry, load_catalog, same_environment
from fluxmq.core.commands import Op, decode
from fluxmq.core.delivery import REPLAY_GROUP_HEADER, Delivery, DeliveryState, GroupState, header
from fluxmq.core.errors import (
    FluxError,
    invalid_argument,
    offset_out_of_range,
    partition_out_of_range,
    queue_exists,
    queue_not_found,
)
from fluxmq.core.queue_config import QueuePolicy, policy_of
from fluxmq.core.views import DeliveryView, GroupView, StateView
from storage.api import PartitionLog, PartitionLogReader, ReadTxn, Record, Store, WriteTxn
from storage.codec import decode_at, position, seal_at
from storage.record_batch import RecordFields, prepare_records

# Headers of a dead letter (DESIGN §2), added to the original message's own headers.
DEAD_HEADERS = (
    "fluxmq-original-queue",
    "fluxmq-original-partition",
    "fluxmq-original-offset",
    "fluxmq-original-timestamp",
    "fluxmq-attempts",
    "fluxmq-dead-reason",
    "fluxmq-dead-at",
    "fluxmq-group",
)
REPLAYED_FROM_HEADER = "fluxmq-replayed-from"


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


class Entry(Protocol):
    """A log entry as the replication layer hands it over (raft.Entry has this shape)."""

    @property
    def index(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


Result = object  # pb.Queue | AppendResult | int | RetentionResult | None | FluxError


@dataclass(slots=True)
class _Batch:
    """Per-transaction scratch state, discarded if the transaction aborts."""

    txn: WriteTxn
    catalog: dict[str, QueueEntry] | None = None  # copy-on-write of the catalog
    last_ts: dict[int, int] = field(default_factory=dict)
    node_addresses: dict[str, str] | None = None  # copy-on-write of node_addresses


class QueueStateMachine:
    """Owns the writes to one store, and every piece of mutable state derived from it.

    One applier at a time calls ``apply_batch`` and ``install_snapshot`` (the shard serializes
    them). Everyone else reads ``view`` (an immutable ``StateView``, swapped in after each
    commit) and read transactions of the store; nothing here is shared through a lock."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._catalog: dict[str, QueueEntry] = {}
        self._node_addresses: dict[str, str] = {}  # raft address -> gRPC address
        self._applied = 0
        # Last timestamp per log, to keep timestamps of a log non-decreasing even if the leader's
        # clock steps back. Filled from storage on a miss, so it only ever reflects commits.
        self._last_ts: dict[int, int] = {}
        self.delivery = DeliveryState()
        self._reload()
        self._view = self._whole_view()
        # Called after each commit with the logs that grew (from the applying thread): how
        # waiting readers learn about new records whoever proposed them.
        self.commit_listener: Callable[[list[int], list[int]], None] | None = None
        self.dead_letters_dropped = 0  # dead messages of queues without a DLQ (since start)
        self._handlers: dict[Op, Callable[[_Batch, Any], Result]] = {
            Op.CREATE_QUEUE: self._create_queue,
            Op.UPDATE_QUEUE: self._update_queue,
            Op.DELETE_QUEUE: self._delete_queue,
            Op.APPEND: self._append,
            Op.PURGE: self._purge,
            Op.APPLY_RETENTION: self._apply_retention,
            Op.CREATE_GROUP: self._create_group,
            Op.DELETE_GROUP: self._delete_group,
            Op.LEASE: self._lease,
            Op.ACK: self._ack,
            Op.NACK: self._nack,
            Op.EXTEND_LEASE: self._extend,
            Op.EXPIRE_LEASES: self._expire,
            Op.COMMIT_OFFSETS: self._commit_offsets,
            Op.RESET_OFFSETS: self._reset_offsets,
            Op.REPLAY_DEAD_LETTERS: self._replay_dead_letters,
            Op.PURGE_DEAD_LETTERS: self._purge_dead_letters,
            Op.TRANSACT: self._transact,
            Op.JOIN_GROUP: self._join_group,
            Op.LEAVE_GROUP: self._leave_group,
            Op.RELEASE_PARTITIONS: self._release_partitions,
            Op.EXPIRE_MEMBERS: self._expire_members,
            Op.RECORD_NODE_ADDRESS: self._record_node_address,
            Op.INIT_PRODUCER: self._init_producer,
        }

    @property
    def view(self) -> StateView:
        """The state as of the last commit, never changed afterwards (any thread)."""
        return self._view

    @property
    def catalog(self) -> Mapping[str, QueueEntry]:
        """The catalog as of the last commit (any thread)."""
        return self._view.catalog

    @property
    def store(self) -> Store:
        return self._store

    def last_applied_index(self) -> int:
        return self._applied

    def node_address(self, raft_address: str) -> str | None:
        """The gRPC address the node at ``raft_address`` recorded (None: never recorded)."""
        return self._view.node_addresses.get(raft_address)

    def _whole_view(self) -> StateView:
        return StateView(
            self._applied, self._catalog, self._node_addresses, DeliveryView.of(self.delivery)
        )

    def _reload(self) -> None:
        """Derive everything held in memory from the store, from one consistent view."""
        with self._store.read() as txn:
            catalog = load_catalog(txn)
            node_addresses = {
                k[len(keys.NODE_ADDRESS) :].decode(): v.decode()
                for k, v in txn.scan(keys.NODE_ADDRESS)
            }
            raw = txn.get(keys.APPLIED)
            delivery = DeliveryState.load(txn)
        self._catalog = catalog
        self._node_addresses = node_addresses
        self._applied = keys.U64.unpack(raw)[0] if raw else 0
        self._last_ts = {}
        self.delivery = delivery

    def digest(self) -> str:
        """Hex sha256 of the whole replicated state, equal on replicas that applied the same
        entries. The applied index is left out: a replica reports it on its own, and entries that
        change nothing (skipped ones, no-ops) must not make equal states differ.

        Reads one consistent view of the store (hashing a large store must not stall applies);
        a caller that needs the index the digest belongs to reads the applied index before and
        after, and tries again if it moved."""
        return self._store.digest(exclude_kv_keys=(keys.APPLIED,))

    def write_snapshot(self, path: str) -> int:
        """Write a copy of the whole state to the new file ``path`` (fsync'd); return the
        applied index it reflects. Applies wait only while the copy's view is opened, not during
        the copy: the view is a read transaction that later commits do not change."""
        with self._store.read() as txn:
            # A read transaction sees whole commits only, and the applied index is written in
            # the same transaction as the batch: the copy is exactly the state at ``applied``.
            raw = txn.get(keys.APPLIED)
            applied = keys.U64.unpack(raw)[0] if raw else 0
            self._store.copy_to(path, txn)
        return applied

    def install_snapshot(self, path: str) -> None:
        """Replace the whole state by the copy in ``path`` (written by ``write_snapshot``),
        atomically for readers of the store; then wake every waiting reader, since any log or
        group may have changed."""
        old_logs = self._log_ids()
        old_groups = self._group_ids()
        self._store.replace_from(path)
        self._reload()
        self._view = self._whole_view()
        log_ids = sorted(old_logs | self._log_ids())
        group_ids = sorted(old_groups | self._group_ids())
        if self.commit_listener is not None:
            self.commit_listener(log_ids, group_ids)

    def _log_ids(self) -> set[int]:
        return {
            keys.log_id(entry.queue_id, partition)
            for entry in self._catalog.values()
            for partition in range(entry.policy.partitions)
        }

    def _group_ids(self) -> set[int]:
        return {g.group_id for by_name in self.delivery.groups.values() for g in by_name.values()}

    def apply_batch(self, entries: Sequence[Entry]) -> list[Result]:
        """Apply ``entries`` (indexes increasing, not necessarily consecutive: the replication
        log holds entries that never reach the state machine) in one durable transaction.
        Entries at or below the last applied index are skipped (their result is None)."""
        results: list[Result] = []
        applied = self._applied
        try:
            with self._store.write() as txn:
                batch = _Batch(txn)
                for entry in entries:
                    if entry.index <= applied:
                        results.append(None)
                        continue
                    results.append(self._apply_one(batch, entry.payload))
                    applied = entry.index
                if applied != self._applied:
                    txn.put(keys.APPLIED, keys.U64.pack(applied))
        except BaseException:
            # The transaction rolled back: so must the in-memory delivery state (the published
            # view never saw any of it).
            with self._store.read() as rtxn:
                self.delivery = DeliveryState.load(rtxn)
            raise
        # Committed: only now do readers see the new catalog and the new timestamps.
        self._applied = applied
        if batch.catalog is not None:
            self._catalog = batch.catalog
        if batch.node_addresses is not None:
            self._node_addresses = batch.node_addresses
        self._last_ts.update(batch.last_ts)
        touched = sorted(self.delivery.touched)
        members_touched = set(self.delivery.members_touched)
        self.delivery.touched.clear()
        self.delivery.members_touched.clear()
        before = self._view
        self._view = StateView(
            applied,
            self._catalog,
            self._node_addresses,
            DeliveryView.changed(before.delivery, self.delivery, touched, members_touched),
        )
        if (batch.last_ts or touched) and self.commit_listener is not None:
            self.commit_listener(sorted(batch.last_ts), touched)
        return results

    # -- dispatch ---------------------------------------------------------------------------

    def _apply_one(self, batch: _Batch, payload: bytes) -> Result:
        op, cmd = decode(payload)
        try:
            return self._dispatch(batch, op, cmd)
        except FluxError as err:
            # Refusals are raised before anything changes (checked first, then applied).
            assert not self.delivery.dead_letters
            return err
        finally:
            self.delivery.flush(batch.txn)

    def _dispatch(self, batch: _Batch, op: Op, cmd: object) -> Result:
        handler = self._handlers.get(op)
        if handler is None:
            raise AssertionError(f"op {op} has no handler")
        return handler(batch, cmd)

    def _cat(self, batch: _Batch) -> dict[str, QueueEntry]:
        return batch.catalog if batch.catalog is not None else self._catalog

    def _cat_for_write(self, batch: _Batch) -> dict[str, QueueEntry]:
        if batch.catalog is None:
            batch.catalog = dict(self._catalog)
        return batch.catalog

    def _entry(self, batch: _Batch, name: str, queue_id: int | None = None) -> QueueEntry:
        entry = self._cat(batch).get(name)
        if entry is None or (queue_id is not None and entry.queue_id != queue_id):
            raise queue_not_found(name)
        return entry

    # -- node addresses ---------------------------------------------------------------------

    def _record_node_address(self, batch: _Batch, cmd: cpb.RecordNodeAddressCmd) -> None:
        if batch.node_addresses is None:
            batch.node_addresses = dict(self._node_addresses)
        batch.node_addresses[cmd.raft_address] = cmd.grpc_address
        batch.txn.put(keys.NODE_ADDRESS + cmd.raft_address.encode(), cmd.grpc_address.encode())

    # -- queues -----------------------------------------------------------------------------

    def _create_queue(self, batch: _Batch, cmd: cpb.CreateQueueCmd) -> pb.Queue:
        name = cmd.config.name
        if name in self._cat(batch):
            raise queue_exists(name)
        check_dead_letter_environments(self._cat(batch), cmd.config)
        serves, adopt = dls.dead_letter_role(
            self._cat(batch), cmd.config, None, self._messages_held(batch)
        )
        if len(self._cat(batch)) >= limits.QUEUES_MAX:
            raise FluxError("QUEUE_LIMIT", f"the broker holds {limits.QUEUES_MAX} queues already")
        txn = batch.txn
        raw = txn.get(keys.NEXT_QUEUE_ID)
        queue_id = keys.U64.unpack(raw)[0] if raw else 1
        txn.put(keys.NEXT_QUEUE_ID, keys.U64.pack(queue_id + 1))
        queue = pb.Queue(
            config=cmd.config,
            queue_id=queue_id,
            created_at_ms=cmd.now_ms,
            updated_at_ms=cmd.now_ms,
            dead_letter_of=serves,
        )
        txn.put(keys.queue_key(name), queue.SerializeToString())
        self._cat_for_write(batch)[name] = QueueEntry(queue, policy_of(queue.config))
        if adopt is not None:
            self._mark_dead_letter_queue(batch, adopt, name)
        return queue

    def _messages_held(self, batch: _Batch) -> Callable[[QueueEntry], bool]:
        def holds(entry: QueueEntry) -> bool:
            for partition in range(entry.policy.partitions):
                wm = batch.txn.log(keys.log_id(entry.queue_id, partition)).watermarks()
                if wm.high > wm.low:
                    return True
            return False

        return holds

    def _mark_dead_letter_queue(self, batch: _Batch, entry: QueueEntry, origin: str) -> None:
        """``entry`` becomes a DLQ (of ``origin`` first): from now on it never gets a DLQ."""
        queue = pb.Queue()
        queue.CopyFrom(entry.queue)
        queue.dead_letter_of = origin
        batch.txn.put(keys.queue_key(entry.name), queue.SerializeToString())
        self._cat_for_write(batch)[entry.name] = QueueEntry(queue, entry.policy)

    def _update_queue(self, batch: _Batch, cmd: cpb.UpdateQueueCmd) -> pb.Queue:
        old = self._entry(batch, cmd.config.name, cmd.queue_id)
        if old.queue.updated_at_ms != cmd.expected_updated_at_ms:
            raise FluxError(
                "CONCURRENT_UPDATE",
                f"queue {cmd.config.name!r} changed while this update was prepared; retry it",
                retriable=True,
            )
        if cmd.config.partitions < old.queue.config.partitions:
            raise FluxError("INVALID_ARGUMENT", "partitions can grow but never shrink")
        if cmd.config.type != old.queue.config.type:
            raise FluxError("INVALID_ARGUMENT", "the queue type cannot be changed")
        check_dead_letter_environments(self._cat(batch), cmd.config)
        _serves, adopt = dls.dead_letter_role(
            self._cat(batch), cmd.config, old, self._messages_held(batch)
        )
        queue = pb.Queue()
        queue.CopyFrom(old.queue)
        queue.config.CopyFrom(cmd.config)
        # Strictly increasing, so every update makes a new version even within one millisecond.
        queue.updated_at_ms = max(cmd.now_ms, old.queue.updated_at_ms + 1)
        batch.txn.put(keys.queue_key(cmd.config.name), queue.SerializeToString())
        self._cat_for_write(batch)[cmd.config.name] = QueueEntry(queue, policy_of(queue.config))
        if adopt is not None:
            self._mark_dead_letter_queue(batch, adopt, cmd.config.name)
        if cmd.config.partitions > old.queue.config.partitions:
            for g in self.delivery.of_queue(old.queue_id):
                if g.membership is not None and g.membership.members and g.ordered:
                    msh.rebalance(g.membership, cmd.config.partitions)
                    self.delivery.save_membership(batch.txn, g)
        return queue

    def _delete_queue(self, batch: _Batch, cmd: cpb.DeleteQueueCmd) -> None:
        entry = self._entry(batch, cmd.name)
        txn = batch.txn
        txn.delete(keys.queue_key(cmd.name))
        # The records go in bounded chunks on later retention passes: deleting a large queue
        # must not hold the writer (and every other queue's publishes) for seconds.
        for partition in range(entry.policy.partitions):
            txn.put(keys.TRASH + keys.U64.pack(keys.log_id(entry.queue_id, partition)), b"")
        self.delivery.delete_queue(txn, entry.queue_id)
        del self._cat_for_write(batch)[cmd.name]

    def _purge(self, batch: _Batch, cmd: cpb.PurgeCmd) -> PurgeResult:
        """Querator's clear, per group; then the log loses what no group needs any more."""
        entry = self._entry(batch, cmd.name, cmd.queue_id or None)
        groups = self.delivery.of_queue(entry.queue_id)
        npart = entry.policy.partitions
        skipped = sum(
            self.delivery.purge(batch.txn, g, entry.policy, cmd.scope, cmd.destructive, cmd.now_ms)
            for g in groups
        )
        purged = 0
        if cmd.destructive or cmd.scope != pb.PURGE_SCOPE_SCHEDULED:
            for partition in range(npart):
                log = batch.txn.log(keys.log_id(entry.queue_id, partition))
                floor = self.consumed_floor(entry, partition, log.watermarks().high)
                purged += log.truncate_before(floor).removed_records
        return PurgeResult(purged, skipped)

    def consumed_floor(self, entry: QueueEntry, partition: int, high: int) -> int:
        """The smallest offset some group of the queue still needs (``high`` if none)."""
        floor = high
        for g in self.delivery.of_queue(entry.queue_id):
            part = g.parts.get(partition)
            floor = min(floor, part.committed if part is not None else 0)
        return floor

    # -- append -----------------------------------------------------------------------------

    def _last_timestamp(self, batch: _Batch, log: PartitionLog) -> int:
        """The timestamp of the log's last stored record (0 when it has none): a function of
        the stored state only, so a replica that restarted computes the same value."""
        wm = log.watermarks()
        if wm.high == wm.low:
            return 0
        ts = batch.last_ts.get(log.log_id)
        if ts is None:
            ts = self._last_ts.get(log.log_id)
        if ts is None:
            ts = log.read(wm.high - 1, 1, 1)[0].timestamp_ms
        return ts

    def _check_append(self, batch: _Batch, cmd: cpb.AppendCmd) -> QueueEntry:
        entry = self._entry(batch, cmd.queue, cmd.queue_id)
        count = len(cmd.partitions)
        if cmd.batches:
            per_partition: dict[int, int] = {}
            for p in cmd.partitions:
                per_partition[p] = per_partition.get(p, 0) + 1
            sound = (
                not cmd.records
                and not cmd.idempotency_keys
                and per_partition == {b.partition: b.count for b in cmd.batches}
                and len(cmd.batches) == len(per_partition)
            )
        else:
            sound = len(cmd.records) == count and (
                not cmd.idempotency_keys or len(cmd.idempotency_keys) == count
            )
        if not sound or not 1 <= count <= limits.PUBLISH_MESSAGES_MAX:
            raise FluxError("INVALID_ARGUMENT", "append: one partition per record, 1..1000 records")
        npart = entry.policy.partitions
        partitions = set(cmd.partitions)
        for p in partitions:
            if p >= npart:
                raise FluxError("PARTITION_OUT_OF_RANGE", f"partition {p} >= {npart}")
        if cmd.producer_id and (len(partitions) != 1 or any(cmd.idempotency_keys)):
            raise FluxError(
                "INVALID_ARGUMENT", "append: a producer session's records are of one partition"
            )
        return entry

    def _append(self, batch: _Batch, cmd: cpb.AppendCmd) -> AppendResult:
        return self._append_checked(batch, self._check_append(batch, cmd), cmd)

    def _append_checked(self, batch: _Batch, entry: QueueEntry, cmd: cpb.AppendCmd) -> AppendResult:
        partitions = cmd.partitions
        idempotency_keys = cmd.idempotency_keys
        count = len(partitions)
        txn = batch.txn
        queue_id = entry.queue_id
        now_ms = cmd.now_ms
        admit: producers.Admit | None = None
        if cmd.producer_id:
            verdict = producers.check_sequence(
                txn, entry.name, queue_id, partitions[0], cmd.producer_id, cmd.producer_epoch,
                cmd.first_sequence, count,
            )  # fmt: skip
            if isinstance(verdict, producers.Retry):
                base, ts = verdict.base_offset, verdict.timestamp_ms
                return AppendResult(
                    list(partitions), list(range(base, base + count)), [ts] * count,
                    [True] * count, {},
                )  # fmt: skip
            admit = verdict
        if cmd.batches:
            return self._append_batches(batch, entry, cmd, admit)
        records = cmd.records
        out_partitions = list(partitions)
        out_offsets = [0] * count
        out_timestamps = [0] * count
        duplicates = [False] * count
        # Within-command duplicates point at the first record with the same key.
        first_with_key: dict[str, int] = {}
        later_duplicates: list[tuple[int, int]] = []
        skip: set[int] = set()
        if idempotency_keys:
            window_ms = entry.policy.dedup_window_ms
            for i, idem in enumerate(idempotency_keys):
                if not idem:
                    continue
                j = first_with_key.get(idem)
                if j is not None:
                    later_duplicates.append((i, j))
                    skip.add(i)
                    continue
                first_with_key[idem] = i
                raw = txn.get(keys.dedup_key(queue_id, idem))
                if raw is not None:
                    part, off, ts = keys.DEDUP_VALUE.unpack(raw)
                    if now_ms - ts < window_ms:
                        out_partitions[i], out_offsets[i], out_timestamps[i] = part, off, ts
                        duplicates[i] = True
                        skip.add(i)

        by_partition: dict[int, list[int]] = {}
        for i, p in enumerate(partitions):
            if i not in skip:
                by_partition.setdefault(p, []).append(i)

        highs: dict[int, int] = {}
        for partition, indexes in by_partition.items():
            log = txn.log(keys.log_id(queue_id, partition))
            ts = max(now_ms, self._last_timestamp(batch, log))
            # Records that came one by one (format 1: entries from before record batches, and
            # requests with idempotency keys) are stored one batch each: the layout
            # `fluxmq migrate` gives format-1 rows, so a replica that replays old entries after
            # its migration holds the same batches as one that migrated them.
            first = log.watermarks().high
            # (No producer fields in their headers either: format 1 kept none.)
            for i in indexes:
                log.append_batch(ts, 1, prepare_records([_fields_of(records[i])]))
            if admit is not None:
                producers.record(txn, admit, first, ts, now_ms)
            for n, i in enumerate(indexes):
                out_offsets[i] = first + n
                out_timestamps[i] = ts
            highs[partition] = first + len(indexes)
            batch.last_ts[log.log_id] = ts

        for i, j in later_duplicates:
            out_partitions[i], out_offsets[i] = out_partitions[j], out_offsets[j]
            out_timestamps[i] = out_timestamps[j]
            duplicates[i] = True

        for idem, i in first_with_key.items():
            if duplicates[i]:
                continue
            dkey = keys.dedup_key(queue_id, idem)
            old = txn.get(dkey)
            if old is not None:  # an expired entry still waiting for its cleanup pass
                txn.delete(keys.dedup_expiry_key(queue_id, keys.DEDUP_VALUE.unpack(old)[2], idem))
            txn.put(
                dkey, keys.DEDUP_VALUE.pack(out_partitions[i], out_offsets[i], out_timestamps[i])
            )
            txn.put(keys.dedup_expiry_key(queue_id, out_timestamps[i], idem), b"")

        return AppendResult(out_partitions, out_offsets, out_timestamps, duplicates, highs)

    def _append_batches(
        self, batch: _Batch, entry: QueueEntry, cmd: cpb.AppendCmd, admit: producers.Admit | None
    ) -> AppendResult:
        """The leader's record batches, one per partition, each stored as it came (stamped and
        checksummed, never opened)."""
        txn = batch.txn
        now_ms = cmd.now_ms
        bases: dict[int, int] = {}
        stamps: dict[int, int] = {}
        highs: dict[int, int] = {}
        for b in cmd.batches:
            log = txn.log(keys.log_id(entry.queue_id, b.partition))
            ts = max(now_ms, self._last_timestamp(batch, log))
            if admit is not None:
                base = log.append_batch(
                    ts, b.count, b.records, cmd.producer_id, cmd.producer_epoch,
                    cmd.first_sequence,
                )  # fmt: skip
                producers.record(txn, admit, base, ts, now_ms)
            else:
                base = log.append_batch(ts, b.count, b.records)
            bases[b.partition] = base
            stamps[b.partition] = ts
            highs[b.partition] = base + b.count
            batch.last_ts[log.log_id] = ts
        partitions = list(cmd.partitions)
        offsets: list[int] = []
        timestamps: list[int] = []
        if len(bases) == 1:
            (base,), (ts,) = bases.values(), stamps.values()
            offsets = list(range(base, base + len(partitions)))
            timestamps = [ts] * len(partitions)
        else:
            for p in partitions:
                offsets.append(bases[p])
                bases[p] += 1
                timestamps.append(stamps[p])
        return AppendResult(partitions, offsets, timestamps, [False] * len(partitions), highs)

    # -- retention --------------------------------------------------------------------------

    def _apply_retention(self, batch: _Batch, cmd: cpb.ApplyRetentionCmd) -> RetentionResult:
        txn = batch.txn
        result = RetentionResult()
        budget = limits.RETENTION_RECORDS_PER_PASS_MAX
        # Queue id order, not dict order: a replica that restarted rebuilt its catalog in another
        # order, and the shared budget must be spent identically everywhere.
        for entry in sorted(self._cat(batch).values(), key=_by_queue_id):
            if budget <= 0:
                break
            if not entry.policy.has_retention:
                continue
            for partition in range(entry.policy.partitions):
                log = txn.log(keys.log_id(entry.queue_id, partition))
                cut = retention_cut(log, entry.policy, cmd.now_ms)
                if entry.policy.retain_until_consumed:
                    cut = min(cut, self.consumed_floor(entry, partition, cut))
                if cut > log.watermarks().low and budget > 0:
                    done = log.truncate_before(cut, max_records=budget)
                    budget -= done.removed_records
                    result.removed_records += done.removed_records
                    result.removed_bytes += done.removed_bytes
                    low = log.watermarks().low
                    for g in self.delivery.of_queue(entry.queue_id):
                        self.delivery.catch_up(txn, g, partition, low)
        result.expired_dedup_keys = self._expire_dedup(batch, cmd.now_ms)
        result.dropped_records = self._drop_trash(batch)
        live = {e.queue_id for e in self._cat(batch).values()}
        result.expired_producers = producers.expire(txn, live, cmd.now_ms)
        return result

    # -- producer sessions ------------------------------------------------------------------

    def _init_producer(self, batch: _Batch, cmd: cpb.InitProducerCmd) -> producers.ProducerGrant:
        entry = self._entry(batch, cmd.queue, cmd.queue_id)
        producers.check_name(cmd.producer_name)
        return producers.init(batch.txn, entry.queue_id, cmd.producer_name, cmd.now_ms)

    def _expire_dedup(self, batch: _Batch, now_ms: int) -> int:
        txn = batch.txn
        windows = {e.queue_id: e.policy.dedup_window_ms for e in self._cat(batch).values()}
        doomed: list[tuple[bytes, bytes]] = []
        for key, _ in _expired_dedup_rows(txn, windows, now_ms):
            queue_id, _ts, idem = keys.split_dedup_expiry_key(key)
            doomed.append((key, keys.dedup_key(queue_id, idem)))
            if len(doomed) >= limits.DEDUP_EXPIRIES_PER_PASS_MAX:
                break
        for expiry_key, dedup_key in doomed:
            txn.delete(expiry_key)
            txn.delete(dedup_key)
        return len(doomed)

    def _drop_trash(self, batch: _Batch) -> int:
        txn = batch.txn
        budget = limits.DROP_RECORDS_PER_PASS_MAX
        dropped = 0
        gone: list[bytes] = []
        for key, _ in txn.scan(keys.TRASH):
            log = txn.log(keys.U64.unpack_from(key, len(keys.TRASH))[0])
            wm = log.watermarks()
            chunk = min(budget, wm.high - wm.low)
            if log.drop(max_records=budget):
                gone.append(key)
            dropped += chunk
            budget -= chunk
            if budget <= 0:
                break
        for key in gone:
            txn.delete(key)
        return dropped

    # -- consumer groups --------------------------------------------------------------------

    def _group(
        self, batch: _Batch, queue: str, queue_id: int, group: str
    ) -> tuple[QueueEntry, GroupState]:
        entry = self._entry(batch, queue, queue_id)
        return entry, self.delivery.get(entry.queue_id, queue, group)

    def _create_group(self, batch: _Batch, cmd: cpb.CreateGroupCmd) -> pb.Group:
        entry = self._entry(batch, cmd.queue, cmd.queue_id)
        txn = batch.txn
        raw = txn.get(keys.NEXT_GROUP_ID)
        group_id = keys.U64.unpack(raw)[0] if raw else 1
        meta = pb.Group(
            queue=cmd.queue,
            name=cmd.group,
            mode=cmd.mode or pb.DELIVERY_MODE_SHARED,
            filter=cmd.filter,
            start=cmd.start,
            created_at_ms=cmd.now_ms,
            group_id=group_id,
        )
        starts = {
            p: start_offset(txn.log(keys.log_id(entry.queue_id, p)), cmd.start)
            for p in range(entry.policy.partitions)
        }
        self.delivery.create(txn, entry.queue_id, meta, starts)
        txn.put(keys.NEXT_GROUP_ID, keys.U64.pack(group_id + 1))
        return meta

    def _delete_group(self, batch: _Batch, cmd: cpb.DeleteGroupCmd) -> None:
        _entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        self.delivery.delete(batch.txn, g)

    def _lease(self, batch: _Batch, cmd: cpb.LeaseCmd) -> LeaseResult:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        member = self._check_member(g, cmd.member, exact=True)
        only: set[int] | None = None
        if g.ordered and g.membership is not None and g.membership.members:
            if member is None:
                raise member_required(g)
            only = member.owned
        if member is not None and member.consumer_id != cmd.consumer_id:
            raise invalid_argument(
                "consumer_id",
                f"member {member.member_id!r} joined as consumer {member.consumer_id!r}",
            )
        out = self.delivery.lease(
            batch.txn,
            g,
            entry.policy,
            cmd.consumer_id,
            cmd.max_messages,
            cmd.lease_ms,
            cmd.now_ms,
            only,
        )
        if out:
            self.delivery.save_lease_counter(batch.txn)
        self._write_dead_letters(batch, cmd.now_ms)
        return LeaseResult(g.group_id, out)

    def _check_receipts(self, g: GroupState, receipts: Sequence[pb.Receipt], path: str) -> None:
        for i, r in enumerate(receipts):
            if r.group_id != g.group_id:
                raise foreign_receipt(g, f"{path}[{i}]")

    def _check_member(
        self, g: GroupState, ref: cpb.MemberRef, *, exact: bool = False
    ) -> msh.Member | None:
        """The member a request speaks for (None: not a member request); stale ones fail."""
        if not ref.member_id:
            return None
        return msh.check_member(g.membership, ref.member_id, ref.generation_id, exact=exact)

    def _ack(self, batch: _Batch, cmd: cpb.AckCmd) -> SettleResult:
        _entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        self._check_member(g, cmd.member)
        self._check_receipts(g, cmd.receipts, "receipts")
        return SettleResult(self.delivery.ack(batch.txn, g, cmd.receipts))

    def _nack(self, batch: _Batch, cmd: cpb.NackCmd) -> SettleResult:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        self._check_member(g, cmd.member)
        self._check_receipts(g, cmd.receipts, "receipts")
        if cmd.dead and entry.policy.dead_letter_queue is None:
            raise no_dead_letter_queue(entry.name)
        statuses = self.delivery.nack(
            batch.txn,
            g,
            entry.policy,
            cmd.receipts,
            cmd.now_ms,
            cmd.retry_at_ms,
            cmd.dead,
            cmd.reason,
        )
        self._write_dead_letters(batch, cmd.now_ms)
        return SettleResult(statuses)

    def _extend(self, batch: _Batch, cmd: cpb.ExtendLeaseCmd) -> SettleResult:
        _entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        self._check_member(g, cmd.member)
        self._check_receipts(g, cmd.receipts, "receipts")
        out = self.delivery.extend(batch.txn, g, cmd.receipts, cmd.now_ms, cmd.lease_ms)
        return SettleResult([s for s, _ in out], [d for _, d in out])

    def _expire(self, batch: _Batch, cmd: cpb.ExpireLeasesCmd) -> ExpireResult:
        policies = {e.queue_id: e.policy for e in self._cat(batch).values()}
        leases, ttl = self.delivery.expire(batch.txn, policies, cmd.now_ms)
        dead = self._write_dead_letters(batch, cmd.now_ms)
        return ExpireResult(leases, ttl, dead)

    def _commit_offsets(self, batch: _Batch, cmd: cpb.CommitOffsetsCmd) -> None:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        self._check_member(g, cmd.member)
        if entry.queue.config.type != pb.QUEUE_TYPE_STREAM:
            raise FluxError(
                "NOT_A_STREAM_QUEUE",
                f"queue {entry.name!r} is a work queue: its offsets move with Ack and Nack "
                "(ResetOffsets replays or skips)",
                metadata={"queue": entry.name},
            )
        txn = batch.txn
        for p, offset in sorted(cmd.offsets.items()):
            if p >= entry.policy.partitions:
                raise partition_out_of_range(
                    entry.name, p, entry.policy.partitions, f"offsets[{p}]"
                )
            wm = txn.log(keys.log_id(entry.queue_id, p)).watermarks()
            if offset > wm.high:
                raise offset_out_of_range(entry.name, p, offset, wm.low, wm.high)
        for p, offset in sorted(cmd.offsets.items()):
            self.delivery.reset(txn, g, p, offset)

    def _reset_offsets(self, batch: _Batch, cmd: cpb.ResetOffsetsCmd) -> None:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        npart = entry.policy.partitions
        for i, p in enumerate(cmd.partitions):
            if p >= npart:
                raise partition_out_of_range(entry.name, p, npart, f"partitions[{i}]")
        txn = batch.txn
        for p in sorted(set(cmd.partitions)) if cmd.partitions else range(npart):
            offset = start_offset(txn.log(keys.log_id(entry.queue_id, p)), cmd.to)
            self.delivery.reset(txn, g, p, offset)

    # -- membership -------------------------------------------------------------------------

    def _join_group(self, batch: _Batch, cmd: cpb.JoinGroupCmd) -> MemberResult:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        ms = g.membership or msh.Membership(0, cmd.strategy, {})
        replaced = ms.by_consumer(cmd.consumer_id)
        m = msh.join(
            ms,
            entry.policy.partitions,
            cmd.consumer_id,
            cmd.member_id,
            cmd.session_timeout_ms,
            cmd.strategy,
            cmd.now_ms,
            assigns=g.ordered,
        )
        if replaced is not None and replaced.member_id != cmd.member_id:
            # A restarted worker: the receipts of its old incarnation are lost with it, so its
            # leases end now rather than hold ordered partitions until their deadlines.
            self.delivery.expire_member_leases(batch.txn, g, cmd.consumer_id, cmd.now_ms)
        g.membership = ms
        self.delivery.save_membership(batch.txn, g)
        return MemberResult(member_view(m), ms.group_generation)

    def _leave_group(self, batch: _Batch, cmd: cpb.LeaveGroupCmd) -> int:
        entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        return self._remove_members(batch, entry, g, [cmd.member_id], cmd.now_ms)

    def _remove_members(
        self, batch: _Batch, entry: QueueEntry, g: GroupState, member_ids: list[str], now_ms: int
    ) -> int:
        ms = g.membership
        gone = [ms.members[mid] for mid in member_ids if ms is not None and mid in ms.members]
        if ms is None or not gone:
            return 0
        for m in gone:
            self.delivery.expire_member_leases(batch.txn, g, m.consumer_id, now_ms)
        msh.remove(ms, [m.member_id for m in gone], entry.policy.partitions, assigns=g.ordered)
        self.delivery.save_membership(batch.txn, g)
        return len(gone)

    def _release_partitions(self, batch: _Batch, cmd: cpb.ReleasePartitionsCmd) -> MemberResult:
        _entry, g = self._group(batch, cmd.queue, cmd.queue_id, cmd.group)
        m = msh.check_member(g.membership, cmd.member_id, cmd.generation_id)
        ms = g.membership
        assert ms is not None
        released = msh.release(
            ms, cmd.member_id, cmd.generation_id, lambda p: self.delivery.busy(g, p)
        )
        if released:
            self.delivery.save_membership(batch.txn, g)
        return MemberResult(member_view(m), ms.group_generation, released)

    def _expire_members(self, batch: _Batch, cmd: cpb.ExpireMembersCmd) -> int:
        by_group: dict[int, list[str]] = {}
        for e in cmd.members:
            by_group.setdefault(e.group_id, []).append(e.member_id)
        cat = {e.queue_id: e for e in self._cat(batch).values()}
        expired = 0
        for group_id, member_ids in sorted(by_group.items()):
            g = self.delivery.by_id(group_id)
            entry = cat.get(g.queue_id) if g is not None else None
            if g is None or entry is None:
                continue  # deleted meanwhile
            expired += self._remove_members(batch, entry, g, member_ids, cmd.now_ms)
        return expired

    # -- transactions -----------------------------------------------------------------------

    def _transact(self, batch: _Batch, cmd: cpb.TransactCmd) -> TransactResult:
        """All or nothing: everything is checked before anything is written."""
        groups: list[GroupState] = []
        seen: set[tuple[int, int, int]] = set()
        for i, ack in enumerate(cmd.acks):
            _entry, g = self._group(batch, ack.queue, ack.queue_id, ack.group)
            self._check_member(g, ack.member)
            self._check_receipts(g, ack.receipts, f"acks[{i}].receipts")
            for j, status in enumerate(self.delivery.check_held(g, ack.receipts)):
                r = ack.receipts[j]
                key = (g.group_id, r.partition, r.offset)
                if status or key in seen:
                    name = pb.ReceiptStatus.Name(status or pb.RECEIPT_STATUS_ALREADY_ACKED)
                    raise FluxError(
                        "LEASE_NOT_HELD",
                        f"acks[{i}].receipts[{j}] is {name}: the transaction was not applied",
                        metadata={"field": f"acks[{i}].receipts[{j}]", "status": name},
                    )
                seen.add(key)
            groups.append(g)
        entries = [self._check_append(batch, append) for append in cmd.appends]
        acks = [
            SettleResult(self.delivery.ack(batch.txn, g, ack.receipts))
            for g, ack in zip(groups, cmd.acks, strict=True)
        ]
        appends = [
            self._append_checked(batch, entry, append)
            for entry, append in zip(entries, cmd.appends, strict=True)
        ]
        return TransactResult(acks, appends)

    # -- dead letters -----------------------------------------------------------------------

    def _dead_letter_queue(
        self, batch: _Batch, origin: QueueEntry, now_ms: int
    ) -> QueueEntry | None:
        """The DLQ of ``origin``, created on first use (None: the queue has no DLQ)."""
        name = origin.policy.dead_letter_queue
        if name is None:
            return None
        existing = self._cat(batch).get(name)
        if existing is not None:
            # Another environment's queue is never a DLQ (creates refuse that pairing; this
            # guards state written before they did): the message is dropped and counted.
            return existing if same_environment(existing, origin) else None
        config = pb.QueueConfig(
            name=name,
            partitions=1,
            type=pb.QUEUE_TYPE_WORK,
            dedup_window=limits.DEDUP_WINDOW_DEFAULT,
            max_message_bytes=limits.MESSAGE_BYTES_MAX,
            lease_timeout=limits.LEASE_TIMEOUT_DEFAULT,
            dead_letter_disabled=True,
            environment=origin.queue.config.environment,
        )
        config.retry_backoff.base = limits.RETRY_BACKOFF_BASE_DEFAULT
        config.retry_backoff.max = limits.RETRY_BACKOFF_MAX_DEFAULT
        queue = self._create_queue(batch, cpb.CreateQueueCmd(config=config, now_ms=now_ms))
        queue.dead_letter_of = origin.name
        batch.txn.put(keys.queue_key(name), queue.SerializeToString())
        self._cat_for_write(batch)[name] = QueueEntry(queue, policy_of(queue.config))
        return self._cat(batch)[name]

    def _write_dead_letters(self, batch: _Batch, now_ms: int) -> int:
        pending = self.delivery.dead_letters
        if not pending:
            return 0
        self.delivery.dead_letters = []
        by_id = {e.queue_id: e for e in self._cat(batch).values()}
        written = 0
        for dl in pending:
            origin = by_id[dl.queue_id]
            try:
                dlq = self._dead_letter_queue(batch, origin, now_ms)
            except FluxError:
                # The DLQ cannot be created (queue limit): the state already moved on, so the
                # message is dropped and counted rather than failing the command forever.
                dlq = None
            if dlq is None:
                self.dead_letters_dropped += 1
                continue
            extra = (
                origin.name,
                str(dl.partition),
                str(dl.record.offset),
                str(dl.record.timestamp_ms),
                str(dl.attempts),
                dl.reason,
                str(now_ms),
                dl.group,
            )
            headers = [(k, v) for k, v in dl.record.headers if not k.startswith("fluxmq-")]
            headers += [(k, v.encode()) for k, v in zip(DEAD_HEADERS, extra, strict=True)]
            dls.start_index(batch.txn, dlq.queue_id)
            offset = self._append_raw(
                batch, dlq, 0, now_ms, dl.record.key, dl.record.value, headers
            )
            dls.add(batch.txn, dlq.queue_id, origin.name, offset)
            written += 1
        return written

    def _append_raw(
        self,
        batch: _Batch,
        entry: QueueEntry,
        partition: int,
        now_ms: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> int:
        log = batch.txn.log(keys.log_id(entry.queue_id, partition))
        ts = max(now_ms, self._last_timestamp(batch, log))
        offset = log.append_batch(
            ts, 1, prepare_records([(value, key, tuple(sorted(headers)), None)])
        )
        batch.last_ts[log.log_id] = ts
        return offset

    def _replay_dead_letters(self, batch: _Batch, cmd: cpb.ReplayDeadLettersCmd) -> int:
        """Dead letters of ``cmd.queue`` (only its own, also in a shared DLQ) back to it as new
        messages aimed at their group."""
        origin = self._entry(batch, cmd.queue, cmd.queue_id)
        dlq = self._dead_letter_queue_if_any(batch, origin)
        if dlq is None:
            return 0
        txn = batch.txn
        replayed = 0
        group_filter = cmd.group if cmd.all else ""
        for record in self._dead_letter_records(txn, dlq, origin, cmd.ids, cmd.all, group_filter):
            group = header(record, "fluxmq-group")
            part = int(header(record, "fluxmq-original-partition") or b"0")
            if part >= origin.policy.partitions:
                part = 0
            headers = [(k, v) for k, v in record.headers if not k.startswith("fluxmq-")]
            if group:
                headers.append((REPLAY_GROUP_HEADER, group))
            headers.append((REPLAYED_FROM_HEADER, str(record.offset).encode()))
            self._append_raw(batch, origin, part, cmd.now_ms, record.key, record.value, headers)
            dls.remove(txn, dlq.queue_id, origin.name, record.offset)
            replayed += 1
        self._compact_dead_letters(txn, dlq, origin)
        return replayed

    def _purge_dead_letters(self, batch: _Batch, cmd: cpb.PurgeDeadLettersCmd) -> int:
        """Dead letters of ``cmd.queue`` deleted: only its own. A shared DLQ keeps the other
        queues' letters and anything published to it directly (all = at most
        PURGE_DEAD_LETTERS_PER_COMMAND_MAX per command; the server repeats it)."""
        origin = self._entry(batch, cmd.queue, cmd.queue_id)
        dlq = self._dead_letter_queue_if_any(batch, origin)
        if dlq is None:
            return 0
        txn = batch.txn
        if cmd.all:
            chosen = list(
                itertools.islice(
                    dls.letter_offsets(txn, dlq.queue_id, origin.name),
                    limits.PURGE_DEAD_LETTERS_PER_COMMAND_MAX,
                )
            )
        else:
            chosen = [r.offset for r in self._dead_letter_records(txn, dlq, origin, cmd.ids, False)]
        for offset in chosen:
            dls.remove(txn, dlq.queue_id, origin.name, offset)
        self._compact_dead_letters(txn, dlq, origin)
        return len(chosen)

    def _dead_letter_queue_if_any(self, batch: _Batch, origin: QueueEntry) -> QueueEntry | None:
        return dead_letter_entry(self._cat(batch), origin)

    def _dead_letter_records(
        self,
        txn: ReadTxn,
        dlq: QueueEntry,
        origin: QueueEntry,
        ids: Sequence[int],
        all_: bool,
        group: str = "",
    ) -> list[Record]:
        """The live dead letters of ``origin`` (all, maybe of one group, or those of ``ids``),
        read before any of them changes. "all" takes at most REPLAY_PER_COMMAND_MAX (the server
        repeats the command); ids are capped at the edge."""
        if all_:
            found = (
                r
                for r in dls.letters(txn, dlq.queue_id, origin.name)
                if not group or header(r, "fluxmq-group") == group.encode()
            )
            return list(itertools.islice(found, limits.REPLAY_PER_COMMAND_MAX))
        out = []
        for dl_id in sorted(set(ids)):
            record = dls.letter(txn, dlq.queue_id, origin.name, dl_id)
            if record is not None:
                out.append(record)
        return out

    def _compact_dead_letters(self, txn: WriteTxn, dlq: QueueEntry, origin: QueueEntry) -> None:
        """Move the DLQ's low watermark over the run of gone letters it starts with (a letter of
        another queue, or a message published to the DLQ directly, ends the run) and drop the
        rows left below it. Costs the run, not every gone row: a shared DLQ may keep many."""
        log = txn.log(keys.log_id(dlq.queue_id, 0))
        prefix = keys.DEAD_GONE + keys.U64.pack(dlq.queue_id)
        low = log.watermarks().low
        done = []
        for key, _ in txn.scan(prefix):  # rows below low: the DLQ's own retention or purge
            if keys.U64.unpack_from(key, len(prefix))[0] >= low:
                break
            done.append(key)
        cut = low
        for key, _ in txn.scan(prefix, keys.dead_gone_key(dlq.queue_id, low)):
            if keys.U64.unpack_from(key, len(prefix))[0] != cut:
                break
            done.append(key)
            cut += 1
        if cut > low:
            log.truncate_before(cut)
        for key in done:
            txn.delete(key)
        dls.drop_below(txn, dlq.queue_id, origin.name, cut)


def dead_letter_depth(txn: ReadTxn, catalog: Mapping[str, QueueEntry], origin: QueueEntry) -> int:
    """Dead letters of ``origin`` not replayed or purged (read-only, any thread); in a shared
    DLQ only its own."""
    dlq = dead_letter_entry(catalog, origin)
    if dlq is None:
        return 0
    return dls.count(txn, dlq.queue_id, origin.name)


def check_dead_letter_environments(
    catalog: Mapping[str, QueueEntry], config: pb.QueueConfig
) -> None:
    """PERMISSION_DENIED when creating or updating ``config`` would pair a queue with a DLQ of
    another environment: its DLQ exists elsewhere, or it is the DLQ some other environment's
    queue names. Checked in the state machine, so racing creates through two nodes cannot
    slip past it."""
    dlq_name = policy_of(config).dead_letter_queue
    dlq = catalog.get(dlq_name) if dlq_name is not None else None
    if dlq is not None and dlq.queue.config.environment != config.environment:
        raise FluxError(
            "PERMISSION_DENIED",
            f"queue {config.name!r} cannot use {dlq_name!r} as its dead-letter queue: it belongs "
            "to another environment",
            metadata={"queue": config.name, "dead_letter_queue": str(dlq_name)},
        )
    for entry in catalog.values():
        if (
            entry.policy.dead_letter_queue == config.name
            and entry.name != config.name
            and entry.queue.config.environment != config.environment
        ):
            raise FluxError(
                "PERMISSION_DENIED",
                f"the name {config.name!r} is the dead-letter queue of a queue in another "
                "environment: choose another name",
                metadata={"queue": config.name},
            )


def start_offset(log: PartitionLogReader, start: pb.StartPosition) -> int:
    """Where ``start`` points in ``log``: earliest (default) = low watermark, latest = high,
    an offset clamped into [low, high], or the first record at or after a timestamp."""
    wm = log.watermarks()
    which = start.WhichOneof("position") or "earliest"
    if which == "earliest":
        return wm.low
    if which == "latest":
        return wm.high
    if which == "offset":
        return min(max(start.offset, wm.low), wm.high)
    return log.offset_for_timestamp(start.timestamp_ms)


def foreign_receipt(g: GroupState | GroupView, field_path: str) -> FluxError:
    return FluxError(
        "RECEIPT_MISMATCH",
        f"{field_path} was not issued by group {g.name!r} of queue {g.meta.queue!r}",
        metadata={"field": field_path, "group": g.name},
    )


def member_required(g: GroupState | GroupView) -> FluxError:
    return FluxError(
        "MEMBER_REQUIRED",
        f"ordered group {g.name!r} has members: lease with the member_id and generation_id "
        "JoinGroup returned (partitions are assigned to members)",
        metadata={"group": g.name},
    )


def no_dead_letter_queue(queue: str) -> FluxError:
    return FluxError(
        "NO_DEAD_LETTER_QUEUE",
        f"queue {queue!r} has no dead-letter queue (it is one, or dead_letter_disabled is set)",
        metadata={"queue": queue, "field": "dead"},
    )


def _by_queue_id(entry: QueueEntry) -> int:
    return entry.queue_id


def _fields_of(prepared: bytes) -> RecordFields:
    """The fields of a record that ``storage.codec.prepare`` encoded (format 1): requests with
    idempotency keys, and log entries written before record batches."""
    pos = position(0, 0)
    record = decode_at(pos, 0, 0, seal_at(pos, 0, prepared))
    return record.value, record.key, record.headers, record.idempotency_key


RETENTION_HEADERS_PER_READ = 16


def retention_cut(reader: PartitionLogReader, policy: QueuePolicy, now_ms: int) -> int:
    """The offset below which ``policy`` says records of ``log`` must go (>= low).

    Example: low=0, high=100, max_messages=30 -> 70. Age is computed the same way; bytes cut
    whole batches, oldest first, until the rest fits. The largest cut wins.
    """
    wm = reader.watermarks()
    cut = wm.low
    if policy.max_messages and wm.high - wm.low > policy.max_messages:
        cut = max(cut, wm.high - policy.max_messages)
    if policy.max_age_ms and wm.high > cut:
        cut = max(cut, reader.offset_for_timestamp(now_ms - policy.max_age_ms + 1))
    if policy.max_bytes and wm.high > cut:
        # Whole batches, oldest first (what deleting them frees), within the per-pass budget.
        excess = reader.size_bytes() - policy.max_bytes
        offset = wm.low
        examined = 0
        # A few headers at a time: reading one checks its whole batch, so read what is cut.
        while excess > 0 and offset < wm.high and examined < limits.RETENTION_BATCHES_PER_PASS_MAX:
            headers = reader.batch_headers(offset, RETENTION_HEADERS_PER_READ)
            if not headers:
                break
            for header in headers:
                examined += 1
                excess -= header.size_bytes
                offset = header.last_offset + 1
                cut = max(cut, offset)
                if excess <= 0:
                    break
    return cut


def _expired_dedup_rows(
    txn: ReadTxn, windows: dict[int, int], now_ms: int
) -> Iterator[tuple[bytes, bytes]]:
    """Expiry rows whose key is past its queue's window (or whose queue is gone), oldest first
    within each queue."""
    start: bytes | None = None
    while True:
        advanced = False
        for key, value in txn.scan(keys.DEDUP_EXPIRY, start):
            queue_id, ts, _ = keys.split_dedup_expiry_key(key)
            window = windows.get(queue_id)
            if window is None or now_ms - ts >= window:
                yield key, value
                continue
            # The rest of this queue's rows are younger: jump to the next queue.
            start = keys.DEDUP_EXPIRY + keys.U64.pack(queue_id + 1)
            advanced = True
            break
        if not advanced:
            return


def retention_due(
    txn: ReadTxn,
    catalog: Mapping[str, QueueEntry],
    now_ms: int,
    floor: Callable[[QueueEntry, int, int], int] | None = None,
) -> bool:
    """Whether an ApplyRetention command at ``now_ms`` would change anything (read-only).
    ``floor(entry, partition, cut)`` bounds the cut of retain_until_consumed queues."""
    for entry in catalog.values():
        if not entry.policy.has_retention:
            continue
        for partition in range(entry.policy.partitions):
            log = txn.log(keys.log_id(entry.queue_id, partition))
            cut = retention_cut(log, entry.policy, now_ms)
            if entry.policy.retain_until_consumed and floor is not None:
                cut = floor(entry, partition, cut)
            if cut > log.watermarks().low:
                return True
    windows = {e.queue_id: e.policy.dedup_window_ms for e in catalog.values()}
    for _ in _expired_dedup_rows(txn, windows, now_ms):
        return True
    return any(True for _ in txn.scan(keys.TRASH))
