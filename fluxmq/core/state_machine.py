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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, limits
from fluxmq.core.commands import Op, decode
from fluxmq.core.errors import FluxError, queue_exists, queue_not_found
from fluxmq.core.queue_config import QueuePolicy, policy_of
from storage.api import PartitionLog, PartitionLogReader, ReadTxn, Store, WriteTxn


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A queue as the catalog holds it. Never mutated: an update replaces the entry."""

    queue: pb.Queue
    policy: QueuePolicy

    @property
    def name(self) -> str:
        return str(self.queue.config.name)

    @property
    def queue_id(self) -> int:
        return int(self.queue.queue_id)


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Per message, in request order (columns rather than objects: this is the hot path)."""

    partitions: list[int]
    offsets: list[int]
    timestamps_ms: list[int]
    duplicates: list[bool]
    high_watermarks: dict[int, int]  # partition -> high watermark after the append


@dataclass(slots=True)
class RetentionResult:
    removed_records: int = 0
    removed_bytes: int = 0
    expired_dedup_keys: int = 0
    dropped_records: int = 0


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


def load_catalog(txn: ReadTxn) -> dict[str, QueueEntry]:
    catalog: dict[str, QueueEntry] = {}
    for _key, value in txn.scan(keys.QUEUE):
        queue = pb.Queue.FromString(value)
        catalog[queue.config.name] = QueueEntry(queue, policy_of(queue.config))
    return catalog


class QueueStateMachine:
    """Owns the writes to one store. Reads may happen concurrently from other threads through
    ``catalog`` (swapped atomically after each commit) and read transactions of the store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        with store.read() as txn:
            self._catalog = load_catalog(txn)
            raw = txn.get(keys.APPLIED)
        self._applied = keys.U64.unpack(raw)[0] if raw else 0
        # Last timestamp per log, to keep timestamps of a log non-decreasing even if the leader's
        # clock steps back. Filled from storage on a miss, so it only ever reflects commits.
        self._last_ts: dict[int, int] = {}
        # Called after each commit with the logs that grew (from the applying thread): how
        # waiting readers learn about new records whoever proposed them.
        self.commit_listener: Callable[[list[int]], None] | None = None

    @property
    def catalog(self) -> dict[str, QueueEntry]:
        return self._catalog

    @property
    def store(self) -> Store:
        return self._store

    def last_applied_index(self) -> int:
        return self._applied

    def apply_batch(self, entries: Sequence[Entry]) -> list[Result]:
        """Apply ``entries`` (indexes increasing) in one durable transaction. Entries at or
        below the last applied index are skipped (their result is None)."""
        results: list[Result] = []
        applied = self._applied
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
        # Committed: only now do readers see the new catalog and the new timestamps.
        self._applied = applied
        if batch.catalog is not None:
            self._catalog = batch.catalog
        self._last_ts.update(batch.last_ts)
        if batch.last_ts and self.commit_listener is not None:
            self.commit_listener(sorted(batch.last_ts))
        return results

    # -- dispatch ---------------------------------------------------------------------------

    def _apply_one(self, batch: _Batch, payload: bytes) -> Result:
        op, cmd = decode(payload)
        try:
            if op is Op.APPEND:
                return self._append(batch, cmd)
            if op is Op.CREATE_QUEUE:
                return self._create_queue(batch, cmd)
            if op is Op.UPDATE_QUEUE:
                return self._update_queue(batch, cmd)
            if op is Op.DELETE_QUEUE:
                self._delete_queue(batch, cmd)
                return None
            if op is Op.PURGE:
                return self._purge(batch, cmd)
            if op is Op.APPLY_RETENTION:
                return self._apply_retention(batch, cmd)
        except FluxError as err:
            return err
        raise AssertionError(f"op {op} has no handler")

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

    # -- queues -----------------------------------------------------------------------------

    def _create_queue(self, batch: _Batch, cmd: cpb.CreateQueueCmd) -> pb.Queue:
        name = cmd.config.name
        if name in self._cat(batch):
            raise queue_exists(name)
        if len(self._cat(batch)) >= limits.QUEUES_MAX:
            raise FluxError("QUEUE_LIMIT", f"the broker holds {limits.QUEUES_MAX} queues already")
        txn = batch.txn
        raw = txn.get(keys.NEXT_QUEUE_ID)
        queue_id = keys.U64.unpack(raw)[0] if raw else 1
        txn.put(keys.NEXT_QUEUE_ID, keys.U64.pack(queue_id + 1))
        queue = pb.Queue(
            config=cmd.config, queue_id=queue_id, created_at_ms=cmd.now_ms, updated_at_ms=cmd.now_ms
        )
        txn.put(keys.queue_key(name), queue.SerializeToString())
        self._cat_for_write(batch)[name] = QueueEntry(queue, policy_of(queue.config))
        return queue

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
        queue = pb.Queue()
        queue.CopyFrom(old.queue)
        queue.config.CopyFrom(cmd.config)
        # Strictly increasing, so every update makes a new version even within one millisecond.
        queue.updated_at_ms = max(cmd.now_ms, old.queue.updated_at_ms + 1)
        batch.txn.put(keys.queue_key(cmd.config.name), queue.SerializeToString())
        self._cat_for_write(batch)[cmd.config.name] = QueueEntry(queue, policy_of(queue.config))
        return queue

    def _delete_queue(self, batch: _Batch, cmd: cpb.DeleteQueueCmd) -> None:
        entry = self._entry(batch, cmd.name)
        txn = batch.txn
        txn.delete(keys.queue_key(cmd.name))
        # The records go in bounded chunks on later retention passes: deleting a large queue
        # must not hold the writer (and every other queue's publishes) for seconds.
        for partition in range(entry.policy.partitions):
            txn.put(keys.TRASH + keys.U64.pack(keys.log_id(entry.queue_id, partition)), b"")
        del self._cat_for_write(batch)[cmd.name]

    def _purge(self, batch: _Batch, cmd: cpb.PurgeCmd) -> int:
        entry = self._entry(batch, cmd.name, cmd.queue_id or None)
        purged = 0
        for partition in range(entry.policy.partitions):
            log = batch.txn.log(keys.log_id(entry.queue_id, partition))
            purged += log.truncate_before(log.watermarks().high).removed_records
        return purged

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

    def _append(self, batch: _Batch, cmd: cpb.AppendCmd) -> AppendResult:
        entry = self._entry(batch, cmd.queue, cmd.queue_id)
        records = cmd.records
        partitions = cmd.partitions
        idempotency_keys = cmd.idempotency_keys
        count = len(records)
        if (
            count != len(partitions)
            or (idempotency_keys and len(idempotency_keys) != count)
            or not 1 <= count <= limits.PUBLISH_MESSAGES_MAX
        ):
            raise FluxError("INVALID_ARGUMENT", "append: one partition per record, 1..1000 records")
        npart = entry.policy.partitions
        for p in set(partitions):
            if p >= npart:
                raise FluxError("PARTITION_OUT_OF_RANGE", f"partition {p} >= {npart}")

        txn = batch.txn
        queue_id = entry.queue_id
        now_ms = cmd.now_ms
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
            base = log.append_prepared(ts, [records[i] for i in indexes])
            for n, i in enumerate(indexes):
                out_offsets[i] = base + n
                out_timestamps[i] = ts
            highs[partition] = base + len(indexes)
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
                if cut > log.watermarks().low and budget > 0:
                    done = log.truncate_before(cut, max_records=budget)
                    budget -= done.removed_records
                    result.removed_records += done.removed_records
                    result.removed_bytes += done.removed_bytes
        result.expired_dedup_keys = self._expire_dedup(batch, cmd.now_ms)
        result.dropped_records = self._drop_trash(batch)
        return result

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


def _by_queue_id(entry: QueueEntry) -> int:
    return entry.queue_id


def retention_cut(reader: PartitionLogReader, policy: QueuePolicy, now_ms: int) -> int:
    """The offset below which ``policy`` says records of ``log`` must go (>= low).

    Example: low=0, high=100, max_messages=30 -> 70. Age and bytes are computed the same way and
    the largest cut wins.
    """
    wm = reader.watermarks()
    cut = wm.low
    if policy.max_messages and wm.high - wm.low > policy.max_messages:
        cut = max(cut, wm.high - policy.max_messages)
    if policy.max_age_ms and wm.high > cut:
        cut = max(cut, reader.offset_for_timestamp(now_ms - policy.max_age_ms + 1))
    if policy.max_bytes and wm.high > cut:
        excess = reader.size_bytes() - policy.max_bytes
        offset = wm.low
        # Walk from the oldest record; the walk is bounded by the per-pass budget.
        while (
            excess > 0
            and offset < wm.high
            and offset - wm.low < limits.RETENTION_RECORDS_PER_PASS_MAX
        ):
            for record in reader.read(offset, 1000, 1 << 62):
                if excess <= 0:
                    break
                excess -= record.size_bytes
                offset = record.offset + 1
        cut = max(cut, offset)
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


def retention_due(txn: ReadTxn, catalog: dict[str, QueueEntry], now_ms: int) -> bool:
    """Whether an ApplyRetention command at ``now_ms`` would change anything (read-only)."""
    for entry in catalog.values():
        if not entry.policy.has_retention:
            continue
        for partition in range(entry.policy.partitions):
            log = txn.log(keys.log_id(entry.queue_id, partition))
            if retention_cut(log, entry.policy, now_ms) > log.watermarks().low:
                return True
    windows = {e.queue_id: e.policy.dedup_window_ms for e in catalog.values()}
    for _ in _expired_dedup_rows(txn, windows, now_ms):
        return True
    return any(True for _ in txn.scan(keys.TRASH))
