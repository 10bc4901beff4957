"""Append at apply: records one by one (with idempotency keys), the leader's record batches, a
single record written by the state machine itself (dead letters, replays), and producer
sessions."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import keys, limits, producers
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.results import AppendResult
from fluxmq.core.errors import FluxError
from storage.api import ReadTxn, WriteTxn
from storage.codec import decode_at, position, seal_at
from storage.record_batch import RecordFields, prepare_records


def check_append(ctx: ApplyContext, cmd: cpb.AppendCmd) -> QueueEntry:
    """The queue ``cmd`` appends to, if ``cmd`` is well formed (a leader built it, but its
    shape is what the apply relies on)."""
    entry = ctx.entry(cmd.queue, cmd.queue_id)
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


def apply_append(ctx: ApplyContext, cmd: cpb.AppendCmd) -> AppendResult:
    return append_checked(ctx, check_append(ctx, cmd), cmd)


def append_checked(ctx: ApplyContext, entry: QueueEntry, cmd: cpb.AppendCmd) -> AppendResult:
    """Append ``cmd`` (checked by ``check_append``) to ``entry``."""
    admit: producers.Admit | None = None
    if cmd.producer_id:
        count = len(cmd.partitions)
        verdict = producers.check_sequence(
            ctx.txn, entry.name, entry.queue_id, cmd.partitions[0], cmd.producer_id,
            cmd.producer_epoch, cmd.first_sequence, count,
        )  # fmt: skip
        if isinstance(verdict, producers.Retry):
            base, ts = verdict.base_offset, verdict.timestamp_ms
            return AppendResult(
                list(cmd.partitions), list(range(base, base + count)), [ts] * count,
                [True] * count, {},
            )  # fmt: skip
        admit = verdict
    if cmd.batches:
        return _append_batches(ctx, entry, cmd, admit)
    return _append_records(ctx, entry, cmd, admit)


@dataclass(slots=True)
class _Columns:
    """The answer being built, per message in request order."""

    partitions: list[int]
    offsets: list[int]
    timestamps: list[int]
    duplicates: list[bool]


@dataclass(slots=True)
class _Keys:
    """Idempotency keys of one command: the first message of each key, the later messages with
    a key seen earlier in the command (-> that first one), and the messages not to store."""

    first_with_key: dict[str, int] = field(default_factory=dict)
    later_duplicates: list[tuple[int, int]] = field(default_factory=list)
    skip: set[int] = field(default_factory=set)


def _append_records(
    ctx: ApplyContext, entry: QueueEntry, cmd: cpb.AppendCmd, admit: producers.Admit | None
) -> AppendResult:
    count = len(cmd.partitions)
    out = _Columns(list(cmd.partitions), [0] * count, [0] * count, [False] * count)
    seen = _Keys()
    if cmd.idempotency_keys:
        _find_duplicates(ctx.txn, entry, cmd, out, seen)
    highs = _store_records(ctx, entry, cmd, admit, out, seen.skip)
    for i, j in seen.later_duplicates:
        out.partitions[i], out.offsets[i] = out.partitions[j], out.offsets[j]
        out.timestamps[i] = out.timestamps[j]
        out.duplicates[i] = True
    _remember_keys(ctx.txn, entry.queue_id, seen, out)
    return AppendResult(out.partitions, out.offsets, out.timestamps, out.duplicates, highs)


def _find_duplicates(
    txn: ReadTxn, entry: QueueEntry, cmd: cpb.AppendCmd, out: _Columns, seen: _Keys
) -> None:
    """Within-command duplicates point at the first record with the same key; a key stored
    within the queue's dedup window answers with the stored record."""
    window_ms = entry.policy.dedup_window_ms
    for i, idem in enumerate(cmd.idempotency_keys):
        if not idem:
            continue
        j = seen.first_with_key.get(idem)
        if j is not None:
            seen.later_duplicates.append((i, j))
            seen.skip.add(i)
            continue
        seen.first_with_key[idem] = i
        raw = txn.get(keys.dedup_key(entry.queue_id, idem))
        if raw is not None:
            part, off, ts = keys.DEDUP_VALUE.unpack(raw)
            if cmd.now_ms - ts < window_ms:
                out.partitions[i], out.offsets[i], out.timestamps[i] = part, off, ts
                out.duplicates[i] = True
                seen.skip.add(i)


def _store_records(
    ctx: ApplyContext,
    entry: QueueEntry,
    cmd: cpb.AppendCmd,
    admit: producers.Admit | None,
    out: _Columns,
    skip: set[int],
) -> dict[int, int]:
    """Append the records not in ``skip``; -> partition -> high watermark after."""
    txn = ctx.txn
    now_ms = cmd.now_ms
    by_partition: dict[int, list[int]] = {}
    for i, p in enumerate(cmd.partitions):
        if i not in skip:
            by_partition.setdefault(p, []).append(i)
    highs: dict[int, int] = {}
    for partition, indexes in by_partition.items():
        log = txn.log(keys.log_id(entry.queue_id, partition))
        ts = max(now_ms, ctx.last_timestamp(log))
        # Records that came one by one (format 1: entries from before record batches, and
        # requests with idempotency keys) are stored one batch each: the layout
        # `fluxmq migrate` gives format-1 rows, so a replica that replays old entries after
        # its migration holds the same batches as one that migrated them.
        first = log.watermarks().high
        # (No producer fields in their headers either: format 1 kept none.)
        for i in indexes:
            log.append_batch(ts, 1, prepare_records([_fields_of(cmd.records[i])]))
        if admit is not None:
            producers.record(txn, admit, first, ts, now_ms)
        for n, i in enumerate(indexes):
            out.offsets[i] = first + n
            out.timestamps[i] = ts
        highs[partition] = first + len(indexes)
        ctx.stamped(log.log_id, ts)
    return highs


def _remember_keys(txn: WriteTxn, queue_id: int, seen: _Keys, out: _Columns) -> None:
    for idem, i in seen.first_with_key.items():
        if out.duplicates[i]:
            continue
        dkey = keys.dedup_key(queue_id, idem)
        old = txn.get(dkey)
        if old is not None:  # an expired entry still waiting for its cleanup pass
            txn.delete(keys.dedup_expiry_key(queue_id, keys.DEDUP_VALUE.unpack(old)[2], idem))
        txn.put(dkey, keys.DEDUP_VALUE.pack(out.partitions[i], out.offsets[i], out.timestamps[i]))
        txn.put(keys.dedup_expiry_key(queue_id, out.timestamps[i], idem), b"")


def _append_batches(
    ctx: ApplyContext, entry: QueueEntry, cmd: cpb.AppendCmd, admit: producers.Admit | None
) -> AppendResult:
    """The leader's record batches, one per partition, each stored as it came (stamped and
    checksummed, never opened)."""
    txn = ctx.txn
    now_ms = cmd.now_ms
    bases: dict[int, int] = {}
    stamps: dict[int, int] = {}
    highs: dict[int, int] = {}
    for b in cmd.batches:
        log = txn.log(keys.log_id(entry.queue_id, b.partition))
        ts = max(now_ms, ctx.last_timestamp(log))
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
        ctx.stamped(log.log_id, ts)
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


def append_raw(
    ctx: ApplyContext,
    entry: QueueEntry,
    partition: int,
    now_ms: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes]],
) -> int:
    """One record the state machine writes itself (a dead letter, a replay); -> its offset."""
    log = ctx.txn.log(keys.log_id(entry.queue_id, partition))
    ts = max(now_ms, ctx.last_timestamp(log))
    offset = log.append_batch(ts, 1, prepare_records([(value, key, tuple(sorted(headers)), None)]))
    ctx.stamped(log.log_id, ts)
    return offset


def apply_init_producer(ctx: ApplyContext, cmd: cpb.InitProducerCmd) -> producers.ProducerGrant:
    entry = ctx.entry(cmd.queue, cmd.queue_id)
    producers.check_name(cmd.producer_name)
    return producers.init(ctx.txn, entry.queue_id, cmd.producer_name, cmd.now_ms)


def _fields_of(prepared: bytes) -> RecordFields:
    """The fields of a record that ``storage.codec.prepare`` encoded (format 1): requests with
    idempotency keys, and log entries written before record batches."""
    pos = position(0, 0)
    record = decode_at(pos, 0, 0, seal_at(pos, 0, prepared))
    return record.value, record.key, record.headers, record.idempotency_key
