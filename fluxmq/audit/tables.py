"""The audit's three tables, read straight from a store (pyarrow, no Spark).

``records``: one row per stored record, decoded from the stored record batches
    node, replication_group, queue (null for a log no queue owns), queue_id, partition, offset,
    timestamp_ms, ts_prev (the timestamp of the nearest earlier record of the log that passed
    its check: a timestamp below it means the log is out of time order), key, value, headers
    (name -> bytes), idempotency_key, crc (the stored crc32c of the record's batch, the same for
    all its records), crc_ok (the record's batch passed its checksum and decodes), size_bytes
    (the record's share of its batch, see ``storage.record_batch``), error (why not), and, for a
    dead letter, origin_queue, origin_partition, origin_offset and dead_group (from its
    ``fluxmq-original-*`` and ``fluxmq-group`` headers), and indexed_origin: the origin queue
    the store's own index of dead letters (``DEAD_ORIGIN`` rows) names for this offset of a
    DLQ (null for a letter replayed or purged, which left the index, and for letters written
    before the index existed). For a record of a producer session: producer_id,
    producer_epoch and sequence (its batch's first sequence plus its place in the batch);
    null for records without a session (producer id 0).

    A batch that fails its check gives one row per offset it covers, each with crc_ok false and
    the error, and null fields but for position and crc (nothing it says can be believed; its
    first row carries the batch's stored size, the others none). The offsets it covers are
    base..last from its header's count, bounded by what the stored bytes can hold, by the
    base of the log's next stored batch and by the high watermark; a header too damaged to
    give a count gives one row, at the base offset. A batch that holds the low watermark shows
    only its records from low up (the ones below were truncated, see ``storage.api``); a batch
    wholly below low, or records at or past high, are shown: they are damage.
``logs``: one row per partition log
    its watermarks (low: first stored offset, high: next to be written), size, the metadata
    check's error, the owning queue's partition count, dedup window, type and dead-letter
    queue, and the store's applied index (the last Raft entry applied, the same on replicas
    that applied the same log; null for a store that never recorded one).
``groups``: one row per (consumer group, partition)
    the stored row (committed, next, acked, dead, filtered, skipped, purged, base), the pending
    slots, expanded from their stored runs (leased, scheduled, their lowest and highest offset,
    how many lie outside [committed, next)), and the partition's watermarks read in the same
    transaction.

Logs of deleted queues waiting to be dropped (the ``T/`` rows) are left out: they are being
removed in chunks and belong to no queue.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.audit.layout import StoreRef
from fluxmq.core import keys, limits
from fluxmq.core.delivery import LEASED, SCHEDULED
from fluxmq.core.queue_config import policy_of
from storage import record_batch
from storage.api import CorruptRecordError, Record
from storage.lmdb_inspect import InspectView
from storage.record_batch import CorruptBatchError

OFFSET_END = 2**64 - 1  # the last split of a log reads to here, so stray records are seen too
BATCH_ROWS = 8192  # rows per Arrow batch handed to Spark (reached at a stored batch's end)
SPLITS_PER_LOG_MAX = 4096

_STR, _I32, _I64, _BIN, _BOOL = pa.string(), pa.int32(), pa.int64(), pa.binary(), pa.bool_()
_HEADERS = pa.map_(pa.string(), pa.binary())
_SPARK = {
    _STR: "string",
    _I32: "int",
    _I64: "bigint",
    _BIN: "binary",
    _BOOL: "boolean",
    _HEADERS: "map<string,binary>",
}

RECORDS: list[tuple[str, pa.DataType]] = [
    ("node", _STR),
    ("replication_group", _STR),
    ("queue", _STR),
    ("queue_id", _I64),
    ("partition", _I32),
    ("offset", _I64),
    ("timestamp_ms", _I64),
    ("ts_prev", _I64),
    ("key", _BIN),
    ("value", _BIN),
    ("headers", _HEADERS),
    ("idempotency_key", _STR),
    ("crc", _I64),
    ("crc_ok", _BOOL),
    ("size_bytes", _I32),
    ("error", _STR),
    ("origin_queue", _STR),
    ("origin_partition", _I32),
    ("origin_offset", _I64),
    ("dead_group", _STR),
    ("indexed_origin", _STR),
    ("producer_id", _I64),
    ("producer_epoch", _I64),
    ("sequence", _I64),
]
# What the audit rules read: everything but the payload (value, headers), which is most of the
# bytes and which the stored checksum already stands for.
AUDIT_RECORD_COLUMNS = tuple(n for n, _ in RECORDS if n not in ("value", "headers"))

LOGS: list[tuple[str, pa.DataType]] = [
    ("node", _STR),
    ("replication_group", _STR),
    ("queue", _STR),
    ("queue_id", _I64),
    ("partition", _I32),
    ("log_id", _I64),
    ("low", _I64),
    ("high", _I64),
    ("size_bytes", _I64),
    ("meta_error", _STR),
    ("partitions", _I32),
    ("dedup_window_ms", _I64),
    ("queue_type", _STR),
    ("dead_letter_queue", _STR),
    ("applied_index", _I64),
]

GROUPS: list[tuple[str, pa.DataType]] = [
    ("node", _STR),
    ("replication_group", _STR),
    ("queue", _STR),
    ("queue_id", _I64),
    ("group", _STR),
    ("group_id", _I64),
    ("mode", _STR),
    ("partition", _I32),
    ("committed", _I64),
    ("next", _I64),
    ("acked", _I64),
    ("dead", _I64),
    ("filtered", _I64),
    ("skipped", _I64),
    ("purged", _I64),
    ("base", _I64),
    ("leased", _I64),
    ("scheduled", _I64),
    ("slot_min", _I64),
    ("slot_max", _I64),
    ("slots_outside", _I64),
    ("low", _I64),
    ("high", _I64),
]

TABLES = {"records": RECORDS, "logs": LOGS, "groups": GROUPS}


def spark_ddl(columns: list[tuple[str, pa.DataType]]) -> str:
    """The Spark schema of a table, as DDL: ``node string, ...``."""
    return ", ".join(f"`{name}` {_SPARK[t]}" for name, t in columns)


def arrow_schema(columns: list[tuple[str, pa.DataType]], names: list[str]) -> pa.Schema:
    types = dict(columns)
    return pa.schema([(n, types[n]) for n in names])


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    queue_id: int
    partitions: int
    dedup_window_ms: int
    queue_type: str
    dead_letter_queue: str | None = None


def catalog(view: InspectView) -> dict[int, QueueInfo]:
    """queue_id -> the queue, from the store's catalog rows."""
    out: dict[int, QueueInfo] = {}
    for _key, value in view.scan(keys.QUEUE):
        q = pb.Queue.FromString(value)
        dlq: str | None
        try:
            policy = policy_of(q.config)
            window_ms, dlq = policy.dedup_window_ms, policy.dead_letter_queue
        except Exception:  # a config this version cannot parse: no dedup or DLQ check for it
            window_ms, dlq = 0, None
        qtype = "stream" if q.config.type == pb.QUEUE_TYPE_STREAM else "work"
        out[int(q.queue_id)] = QueueInfo(
            q.config.name, int(q.queue_id), q.config.partitions or 1, window_ms, qtype, dlq
        )
    return out


def applied_index(view: InspectView) -> int | None:
    raw = view.get(keys.APPLIED)
    return keys.U64.unpack(raw)[0] if raw is not None and len(raw) == keys.U64.size else None


def trash(view: InspectView) -> set[int]:
    return {keys.U64.unpack_from(k, len(keys.TRASH))[0] for k, _ in view.scan(keys.TRASH)}


def split_log_id(log_id: int) -> tuple[int, int]:
    """log_id -> (queue_id, partition)."""
    return log_id >> keys.PARTITION_BITS, log_id & ((1 << keys.PARTITION_BITS) - 1)


@dataclass(frozen=True, slots=True)
class Split:
    """One Spark partition of the records table: the stored batches of one log whose base
    offset is in [start, end), every record of each (a split cuts at batch boundaries, so no
    record is read twice or missed, and a batch's records may reach past ``end``). ``low`` and
    ``high`` are the log's watermarks (0 when its metadata is damaged)."""

    store: StoreRef
    queue: str | None
    log_id: int
    start: int
    end: int
    low: int = 0
    high: int = 0


def splits(store: StoreRef, view: InspectView, split_records: int) -> list[Split]:
    """The record splits of one store: each log's [low, high) cut in ``split_records`` pieces,
    the first reaching down to 0 and the last up to the end of the offset space (batches stored
    outside the watermarks are damage the audit must see)."""
    queues = catalog(view)
    gone = trash(view)
    out: list[Split] = []
    for meta in view.logs():
        if meta.log_id in gone:
            continue
        queue_id, _ = split_log_id(meta.log_id)
        q = queues.get(queue_id)
        name = q.name if q else None
        # A log spanning more than SPLITS_PER_LOG_MAX splits gets wider ones (the offsets of a
        # damaged watermark may span the whole u64 space).
        step = max(split_records, -(-(meta.high - meta.low) // SPLITS_PER_LOG_MAX))
        bounds = [0, *range(meta.low + step, meta.high, step), OFFSET_END]
        out.extend(
            Split(store, name, meta.log_id, a, b, meta.low, meta.high)
            for a, b in itertools.pairwise(bounds)
        )
    return out


def _header(headers: tuple[tuple[str, bytes], ...], name: str) -> bytes | None:
    for k, v in headers:
        if k == name:
            return v
    return None


def _int_or_none(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def read_split(split: Split, view: InspectView, names: list[str]) -> Iterator[pa.RecordBatch]:
    """The records of ``split`` as Arrow batches holding the columns ``names``."""
    schema = arrow_schema(RECORDS, names)
    queue_id, partition = split_log_id(split.log_id)
    constant: dict[str, Any] = {
        "node": split.store.node,
        "replication_group": split.store.replication_group,
        "queue": split.queue,
        "queue_id": queue_id,
        "partition": partition,
    }
    payload = bool({"value", "headers"} & set(names))
    last_ts = _timestamp_before(view, split.log_id, split.start, split.low)
    letters = LetterIndex(view, queue_id, split.start, split.end) if partition == 0 else None
    if letters is not None and not letters.origins:
        letters = None  # not a DLQ (or one with no indexed letters): no lookup per record
    cols = _RecordColumns(payload, last_ts, letters)
    for base, buf, next_base in view.batches(split.log_id, split.start, split.end):
        cols.add_batch(split, base, buf, next_base)
        if cols.rows >= BATCH_ROWS:
            yield cols.batch(schema, names, constant)
            cols = _RecordColumns(payload, cols.last_ts, letters)
    if cols.rows:
        yield cols.batch(schema, names, constant)


class LetterIndex:
    """The store's own index of the dead letters a DLQ (a queue's partition 0) holds: DLQ
    offset -> origin queue, from the ``DEAD_ORIGIN`` rows, for the offsets [start, end) of one
    split (read once, in order per origin), with a point lookup for a record of a batch that
    reaches past ``end``. A log with no index rows costs one seek."""

    __slots__ = ("_by_offset", "_end", "_queue_id", "_start", "_view", "origins")

    def __init__(self, view: InspectView, queue_id: int, start: int, end: int) -> None:
        self._view = view
        self._queue_id = queue_id
        self._start, self._end = start, end
        self.origins = _indexed_origins(view, queue_id)
        self._by_offset: dict[int, str] = {}
        for origin in self.origins:
            prefix = keys.dead_origin_prefix(queue_id, origin)
            for key, _ in view.scan(prefix, prefix + keys.U64.pack(start)):
                offset = keys.U64.unpack_from(key, len(prefix))[0]
                if offset >= end:
                    break
                self._by_offset[offset] = origin

    def origin_of(self, offset: int) -> str | None:
        if self._start <= offset < self._end:
            return self._by_offset.get(offset)
        for origin in self.origins:
            if self._view.get(keys.dead_origin_key(self._queue_id, origin, offset)) is not None:
                return origin
        return None


def _indexed_origins(view: InspectView, queue_id: int) -> list[str]:
    """The origin queues with index rows in the DLQ ``queue_id``: one seek per origin (the rows
    of one origin are contiguous, so the scan jumps past them)."""
    prefix = keys.DEAD_ORIGIN + keys.U64.pack(queue_id)
    origins: list[str] = []
    start = prefix
    while len(origins) < DLQ_ORIGINS_MAX:
        key = next((k for k, _ in view.scan(prefix, start)), None)
        if key is None or len(key) <= len(prefix):
            break
        length = key[len(prefix)]
        name = key[len(prefix) + 1 : len(prefix) + 1 + length]
        origins.append(name.decode(errors="replace"))
        start = key[: len(prefix) + 1 + length] + b"\xff" * (keys.U64.size + 1)
    return origins


DLQ_ORIGINS_MAX = 4096  # origin queues looked up per DLQ (a shared DLQ serves a few)
PREVIOUS_LOOKBACK_MAX = 64  # damaged batches skipped looking for the previous good timestamp


def _timestamp_before(view: InspectView, log_id: int, offset: int, low: int) -> int | None:
    """The timestamp of the last record shown below ``offset`` (by the split before this one)
    that passed its check, so ``ts_prev`` is right across split boundaries."""
    for n, (base, buf) in enumerate(view.batches_before(log_id, offset)):
        if n >= PREVIOUS_LOOKBACK_MAX:
            return None
        try:
            shown = _shown(record_batch.decode(log_id, base, buf), low)
        except CorruptRecordError:
            continue
        if shown:
            return shown[-1].timestamp_ms
    return None


def _shown(records: list[Record], low: int) -> list[Record]:
    """The records of one good batch that the table shows: all of them, but for a batch that
    holds ``low``, whose records below it were truncated."""
    if records[0].offset < low <= records[-1].offset:
        return records[low - records[0].offset :]
    return records


def _damaged_offsets(
    err: CorruptRecordError, split: Split, base: int, buf: bytes, next_base: int | None
) -> range:
    """The offsets a batch that failed its check stands for (see the module docstring)."""
    if isinstance(err, CorruptBatchError):
        last = err.last_offset
    else:  # a record inside failed, after the crc (so the header's count) held
        last = record_batch.read_header(split.log_id, base, buf, check_crc=False).last_offset
    if last is None:
        return range(base, base + 1)
    holds_max = max(1, (len(buf) - record_batch.HEADER_SIZE) // record_batch.RECORD_HEAD_SIZE)
    last = min(last, base + holds_max - 1)
    if next_base is not None and next_base > base:
        last = min(last, next_base - 1)
    if base < split.high:
        last = min(last, split.high - 1)
    first = split.low if base < split.low <= last else base
    return range(first, last + 1)


class _RecordColumns:
    """Column lists of about BATCH_ROWS decoded records (one list per field: appending to lists
    and building each Arrow array once is several times faster than a dict per row).
    ``payload``: the value and headers are wanted; without it they are not kept (the origin
    columns of dead letters are still read from the headers)."""

    def __init__(self, payload: bool, last_ts: int | None, letters: LetterIndex | None) -> None:
        self.rows = 0
        self.payload = payload
        self.last_ts = last_ts
        self.letters = letters
        self.c: dict[str, list[Any]] = {n: [] for n, _ in RECORDS}

    def add_batch(self, split: Split, base: int, buf: bytes, next_base: int | None) -> None:
        crc = int.from_bytes(buf[:4], "big") if len(buf) >= 4 else None
        try:
            records = _shown(record_batch.decode(split.log_id, base, buf), split.low)
        except CorruptRecordError as err:
            self._add_damaged(
                _damaged_offsets(err, split, base, buf, next_base), crc, len(buf), err
            )
            return
        for record in records:
            self._add_record(record, crc)
        # The producer fields are the batch's: added once per batch, not per record.
        header = record_batch.read_header(split.log_id, base, buf, check_crc=False)
        c, n = self.c, len(records)
        if header.producer_id:
            first = header.first_sequence + records[0].offset - base
            c["producer_id"].extend(itertools.repeat(_signed64(header.producer_id), n))
            c["producer_epoch"].extend(itertools.repeat(header.producer_epoch, n))
            c["sequence"].extend(_signed64(q) for q in range(first, first + n))
        else:
            for name in ("producer_id", "producer_epoch", "sequence"):
                c[name].extend(itertools.repeat(None, n))

    def _add_damaged(self, offsets: range, crc: int | None, size: int, err: Exception) -> None:
        c = self.c
        error = str(err)
        for offset in offsets:
            self.rows += 1
            c["offset"].append(offset)
            c["crc"].append(crc)
            c["size_bytes"].append(size if offset == offsets.start else None)
            c["crc_ok"].append(False)
            c["error"].append(error)
            for n in _RECORD_FIELDS:
                c[n].append(None)

    def _add_record(self, record: Record, crc: int | None) -> None:
        c = self.c
        self.rows += 1
        c["offset"].append(record.offset)
        c["crc"].append(crc)
        c["size_bytes"].append(record.size_bytes)
        c["crc_ok"].append(True)
        c["error"].append(None)
        c["ts_prev"].append(self.last_ts)
        self.last_ts = record.timestamp_ms
        c["timestamp_ms"].append(record.timestamp_ms)
        c["key"].append(record.key)
        c["idempotency_key"].append(record.idempotency_key)
        headers = record.headers
        indexed = self.letters.origin_of(record.offset) if self.letters is not None else None
        c["indexed_origin"].append(indexed)
        c["value"].append(record.value if self.payload else None)
        c["headers"].append(headers if self.payload else ())
        origin = _header(headers, "fluxmq-original-queue") if headers else None
        if origin is None and indexed is None:
            for n in _ORIGIN_FIELDS:
                c[n].append(None)
            return
        group = _header(headers, "fluxmq-group")
        c["origin_queue"].append(origin.decode(errors="replace") if origin is not None else None)
        c["origin_partition"].append(_int_or_none(_header(headers, "fluxmq-original-partition")))
        c["origin_offset"].append(_int_or_none(_header(headers, "fluxmq-original-offset")))
        c["dead_group"].append(group.decode(errors="replace") if group else None)

    def batch(
        self, schema: pa.Schema, names: list[str], constant: dict[str, Any]
    ) -> pa.RecordBatch:
        arrays = []
        for n in names:
            t = schema.field(n).type
            if n in constant:
                arrays.append(pa.array([constant[n]] * self.rows, t))
            else:
                arrays.append(pa.array(self.c[n], t))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


_ORIGIN_FIELDS = ("origin_queue", "origin_partition", "origin_offset", "dead_group")


def _signed64(n: int) -> int:
    """A u64 of the batch header in an int64 column (ids and sequences this large do not occur,
    but damage may hold any bits: they show as negative rather than failing the read)."""
    return n - (1 << 64) if n >= 1 << 63 else n


_RECORD_FIELDS = (
    "indexed_origin",
    "producer_id",
    "producer_epoch",
    "sequence",
    "timestamp_ms",
    "ts_prev",
    "key",
    "value",
    "idempotency_key",
    "headers",
    *_ORIGIN_FIELDS,
)


def read_logs(store: StoreRef, view: InspectView, names: list[str]) -> Iterator[pa.RecordBatch]:
    queues = catalog(view)
    gone = trash(view)
    applied = applied_index(view)
    rows: list[dict[str, Any]] = []
    for meta in view.logs():
        if meta.log_id in gone:
            continue
        queue_id, partition = split_log_id(meta.log_id)
        q = queues.get(queue_id)
        rows.append(
            {
                "node": store.node,
                "replication_group": store.replication_group,
                "queue": q.name if q else None,
                "queue_id": queue_id,
                "partition": partition,
                "log_id": meta.log_id,
                "low": meta.low,
                "high": meta.high,
                "size_bytes": meta.size_bytes,
                "meta_error": meta.error,
                "partitions": q.partitions if q else None,
                "dedup_window_ms": q.dedup_window_ms if q else None,
                "queue_type": q.queue_type if q else None,
                "dead_letter_queue": q.dead_letter_queue if q else None,
                "applied_index": applied,
            }
        )
    yield from _batches(LOGS, names, rows)


_SLOT_KEY_BYTES = len(keys.slot_run_key(0, 0, 0))  # SLOT and SLOT_RUN keys have one shape


def read_groups(store: StoreRef, view: InspectView, names: list[str]) -> Iterator[pa.RecordBatch]:
    queues = catalog(view)
    metas: dict[int, tuple[int, pb.Group]] = {}
    for key, value in view.scan(keys.GROUP):
        queue_id = keys.U64.unpack_from(key, len(keys.GROUP))[0]
        g = pb.Group.FromString(value)
        metas[int(g.group_id)] = (queue_id, g)
    slots: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for key, value in view.scan(keys.SLOT_RUN):
        if len(key) != _SLOT_KEY_BYTES or len(value) < keys.SLOT_RUN_VALUE.size:
            continue  # too short to read: its slots are missing from the counts (totals rule)
        group_id, partition, last = keys.split_slot_key(key)
        kind, _attempt, _due_ms, _lease_id, first = keys.SLOT_RUN_VALUE.unpack_from(value)
        pending_run = slots.setdefault((group_id, partition), [])
        if 0 <= last - first < limits.PENDING_PER_PARTITION_MAX:
            pending_run.extend((offset, kind) for offset in range(first, last + 1))
        else:
            # No run is longer than a partition's pending window: this row is damaged. Its
            # ends are kept (they show in slot_min/slot_max), and the counts then disagree
            # with the partition row, which the totals rule reports.
            pending_run.extend([(first, kind), (last, kind)])
    for key, value in view.scan(keys.SLOT):  # a store written before slot runs
        if len(key) != _SLOT_KEY_BYTES or len(value) < keys.SLOT_VALUE.size:
            continue
        group_id, partition, offset = keys.split_slot_key(key)
        kind = keys.SLOT_VALUE.unpack_from(value)[0]
        slots.setdefault((group_id, partition), []).append((offset, kind))
    lows_highs = {m.log_id: (m.low, m.high) for m in view.logs() if m.error is None}
    rows: list[dict[str, Any]] = []
    for key, value in view.scan(keys.GROUP_PARTITION):
        group_id = keys.U64.unpack_from(key, len(keys.GROUP_PARTITION))[0]
        partition = keys.U32.unpack_from(key, len(keys.GROUP_PARTITION) + 8)[0]
        committed, nxt, acked, dead, filtered, skipped, purged, base = keys.PARTITION_VALUE.unpack(
            value
        )
        queue_id, meta = metas.get(group_id, (None, None))
        q = queues.get(queue_id) if queue_id is not None else None
        pending = slots.get((group_id, partition), [])
        offsets = [o for o, _ in pending]
        low_high = (
            lows_highs.get(keys.log_id(queue_id, partition)) if queue_id is not None else None
        )
        rows.append(
            {
                "node": store.node,
                "replication_group": store.replication_group,
                "queue": q.name if q else None,
                "queue_id": queue_id,
                "group": meta.name if meta else None,
                "group_id": group_id,
                "mode": (
                    None
                    if meta is None
                    else "ordered"
                    if meta.mode == pb.DELIVERY_MODE_ORDERED
                    else "shared"
                ),
                "partition": partition,
                "committed": committed,
                "next": nxt,
                "acked": acked,
                "dead": dead,
                "filtered": filtered,
                "skipped": skipped,
                "purged": purged,
                "base": base,
                "leased": sum(1 for _, k in pending if k == LEASED),
                "scheduled": sum(1 for _, k in pending if k == SCHEDULED),
                "slot_min": min(offsets, default=None),
                "slot_max": max(offsets, default=None),
                "slots_outside": sum(1 for o in offsets if not committed <= o < nxt),
                "low": low_high[0] if low_high else None,
                "high": low_high[1] if low_high else None,
            }
        )
    yield from _batches(GROUPS, names, rows)


def _batches(
    columns: list[tuple[str, pa.DataType]], names: list[str], rows: list[dict[str, Any]]
) -> Iterator[pa.RecordBatch]:
    schema = arrow_schema(columns, names)
    for at in range(0, len(rows), BATCH_ROWS):
        chunk = rows[at : at + BATCH_ROWS]
        yield pa.RecordBatch.from_arrays(
            [pa.array([r[n] for r in chunk], schema.field(n).type) for n in names], schema=schema
        )
