"""Damage to a copied data directory, one kind at a time, written straight into its LMDB files
(the broker is stopped; nothing here goes through the state machine).

The store keeps record batches (``storage.record_batch``, format 2) in the ``batches``
database, keyed by (log_id, base offset); the faults are batch-format damage: a flipped byte
inside a batch, a lost batch, a batch stored at the wrong place, a batch resealed with other
records (a replica or a bug that wrote something else), damaged log metadata. The functions
that damage a batch return the offsets it holds, which is where the audit must report it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from storage import record_batch
from storage.api import NewRecord, Record
from storage.codec import position

_RECORD_HEAD = struct.Struct(">IIIIHH")  # record_batch's per-record head
_HEADER_NAME_LEN = struct.Struct(">H")
_HEADER_VALUE_LEN = struct.Struct(">I")
_NO_KEY = 0xFFFFFFFF


@contextmanager
def _env(data_dir: Path) -> Iterator[tuple[Any, Any, Any]]:
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            yield txn, env.open_db(b"batches", txn=txn), env.open_db(b"kv", txn=txn)
    finally:
        env.close()


def queue_id(data_dir: Path, queue: str) -> int:
    with _env(data_dir) as (txn, _batches, kv):
        raw = txn.get(keys.queue_key(queue), db=kv)
    assert raw is not None, f"{data_dir} has no queue {queue!r}"
    return int(pb.Queue.FromString(raw).queue_id)


def log_id(data_dir: Path, queue: str, partition: int) -> int:
    return keys.log_id(queue_id(data_dir, queue), partition)


def _batch_holding(txn: Any, batches: Any, lid: int, offset: int) -> tuple[int, bytes]:
    """(base offset, stored bytes) of the batch of ``lid`` that holds ``offset``."""
    pos = position(lid, offset)
    with txn.cursor(db=batches) as cursor:
        at_or_after = cursor.set_range(pos)
        found = (cursor.key() == pos or cursor.prev()) if at_or_after else cursor.last()
        assert found, (lid, offset, "no batch at or below it")
        key, value = cursor.item()
    base = int.from_bytes(key[8:], "big")
    assert key[:8] == position(lid, 0)[:8], (lid, offset, "no batch at or below it")
    header = record_batch.read_header(lid, base, bytes(value))
    assert base <= offset <= header.last_offset, (lid, offset, base, header.last_offset)
    return base, bytes(value)


def batch_range(data_dir: Path, queue: str, partition: int, offset: int) -> tuple[int, int]:
    """(first, last) offset of the stored batch that holds ``offset``."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
    return base, record_batch.read_header(lid, base, buf).last_offset


def read(data_dir: Path, queue: str, partition: int, offset: int) -> Record:
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
    return record_batch.decode(lid, base, buf)[offset - base]


def _value_at(buf: bytes, index: int) -> int:
    """Where the value of record ``index`` of a batch begins, walking the records section
    (record_batch's layout: head, key, value, headers, idempotency key)."""
    at = record_batch.HEADER_SIZE
    for i in range(index + 1):
        _delta, _ts, key_len, value_len, header_count, idem_len = _RECORD_HEAD.unpack_from(buf, at)
        at += _RECORD_HEAD.size + (0 if key_len == _NO_KEY else key_len)
        if i == index:
            assert value_len > 0, "the record has an empty value: no byte to flip"
            return at
        at += value_len
        for _ in range(header_count):
            name_len = _HEADER_NAME_LEN.unpack_from(buf, at)[0]
            at += _HEADER_NAME_LEN.size
            value_len_h = _HEADER_VALUE_LEN.unpack_from(buf, at)[0]
            at += _HEADER_VALUE_LEN.size + name_len + value_len_h
        at += 0 if idem_len == 0xFFFF else idem_len
    raise AssertionError("unreachable")


def flip_value_byte(data_dir: Path, queue: str, partition: int, offset: int) -> tuple[int, int]:
    """Bit rot: one byte of the record's value, inside its batch, changes; the batch's stored
    crc does not. -> (first, last) offset of the batch, every one of which is now unreadable."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
        damaged = bytearray(buf)
        damaged[_value_at(buf, offset - base)] ^= 0x01
        txn.put(position(lid, base), bytes(damaged), db=batches)
    return base, record_batch.read_header(lid, base, buf).last_offset


def delete_batch(data_dir: Path, queue: str, partition: int, offset: int) -> tuple[int, int]:
    """A lost batch: the one holding ``offset`` is gone, the watermarks still cover it.
    -> (first, last) offset of the lost batch."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
        assert txn.delete(position(lid, base), db=batches)
    return base, record_batch.read_header(lid, base, buf).last_offset


def misplace_batch(
    data_dir: Path, queue: str, partition: int, offset: int, to_base: int
) -> tuple[int, int]:
    """A batch stored at the wrong place: the stored bytes of the batch holding ``offset``
    also appear at base offset ``to_base`` (a misdirected write). The crc covers the batch's
    position, so the copy fails its check there. -> (first, last) offset the copy claims."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
        assert txn.put(position(lid, to_base), buf, db=batches, overwrite=False), to_base
    count = record_batch.read_header(lid, base, buf).count
    return to_base, to_base + count - 1


def put_batch(
    data_dir: Path, queue: str, partition: int, records: list[NewRecord], base: int
) -> None:
    """An intact batch (valid crc) of ``records`` stored at ``base``, whatever the watermarks
    say: a write that should not have happened."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        stored = record_batch.encode(lid, base, records)
        assert txn.put(position(lid, base), stored, db=batches, overwrite=False), base


def rewrite(data_dir: Path, queue: str, partition: int, offset: int, **changes: Any) -> Record:
    """Replace a record by an intact one (its batch resealed, valid crc) with ``changes``: a
    replica that wrote something else, or a bug that stored what it should not have. The
    batch keeps its boundaries and producer fields when its timestamps still never decrease;
    otherwise it is resealed as up to three batches (before, the record, after), the only way
    to store a timestamp out of order."""
    lid = log_id(data_dir, queue, partition)
    with _env(data_dir) as (txn, batches, _kv):
        base, buf = _batch_holding(txn, batches, lid, offset)
        header = record_batch.read_header(lid, base, buf)
        records = [_as_new(r) for r in record_batch.decode(lid, base, buf)]
        old = record_batch.decode(lid, base, buf)[offset - base]
        records[offset - base] = replace(records[offset - base], **changes)
        producer = (header.producer_id, header.producer_epoch, header.first_sequence)
        try:
            pieces = [(base, record_batch.encode(lid, base, records, *producer))]
        except ValueError:  # timestamps out of order: cut the batch around the record
            pieces = []
            index = offset - base
            for lo, hi in ((0, index), (index, index + 1), (index + 1, len(records))):
                if lo < hi:
                    pid, epoch, first_seq = producer
                    sealed = record_batch.encode(
                        lid, base + lo, records[lo:hi], pid, epoch, first_seq + lo
                    )
                    pieces.append((base + lo, sealed))
        for piece_base, stored in pieces:
            txn.put(position(lid, piece_base), stored, db=batches)
    return old


def _as_new(record: Record) -> NewRecord:
    return NewRecord(
        timestamp_ms=record.timestamp_ms,
        value=record.value,
        key=record.key,
        headers=record.headers,
        idempotency_key=record.idempotency_key,
    )


def set_header(
    data_dir: Path, queue: str, partition: int, offset: int, name: str, value: bytes
) -> None:
    old = read(data_dir, queue, partition, offset)
    headers = tuple(sorted((*(h for h in old.headers if h[0] != name), (name, value))))
    rewrite(data_dir, queue, partition, offset, headers=headers)


def damage_logmeta(data_dir: Path, queue: str, partition: int) -> None:
    """One byte of the log's metadata entry (low, high, size and their crc) flips."""
    lid = log_id(data_dir, queue, partition)
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(b"logmeta", txn=txn)
            stored = txn.get(keys.U64.pack(lid), db=meta)
            assert stored is not None, (queue, partition, "no metadata entry")
            raw = bytearray(stored)
            raw[15] ^= 0x01  # inside high
            txn.put(keys.U64.pack(lid), bytes(raw), db=meta)
    finally:
        env.close()


GROUP_ROW_FIELDS = ("committed", "next", "acked", "dead", "filtered", "skipped", "purged", "base")


def edit_group_row(data_dir: Path, queue: str, group: str, partition: int, **fields: int) -> None:
    """Overwrite fields of a group partition's stored row (see keys.PARTITION_VALUE)."""
    qid = queue_id(data_dir, queue)
    with _env(data_dir) as (txn, _batches, kv):
        raw = txn.get(keys.group_key(qid, group), db=kv)
        assert raw is not None, (queue, group)
        gid = int(pb.Group.FromString(raw).group_id)
        row_key = keys.group_partition_key(gid, partition)
        row = dict(
            zip(GROUP_ROW_FIELDS, keys.PARTITION_VALUE.unpack(txn.get(row_key, db=kv)), strict=True)
        )
        assert set(fields) <= set(row), fields
        row.update(fields)
        txn.put(row_key, keys.PARTITION_VALUE.pack(*row.values()), db=kv)


def group_row(data_dir: Path, queue: str, group: str, partition: int) -> dict[str, int]:
    qid = queue_id(data_dir, queue)
    with _env(data_dir) as (txn, _batches, kv):
        gid = int(pb.Group.FromString(txn.get(keys.group_key(qid, group), db=kv)).group_id)
        raw = txn.get(keys.group_partition_key(gid, partition), db=kv)
    return dict(zip(GROUP_ROW_FIELDS, keys.PARTITION_VALUE.unpack(raw), strict=True))


def watermarks(data_dir: Path, queue: str, partition: int) -> tuple[int, int]:
    """(low, high) of a log, from its metadata entry."""
    lid = log_id(data_dir, queue, partition)
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin() as txn:
            raw = txn.get(keys.U64.pack(lid), db=env.open_db(b"logmeta", txn=txn))
    finally:
        env.close()
    assert raw is not None
    return int.from_bytes(raw[0:8], "big"), int.from_bytes(raw[8:16], "big")


def high(data_dir: Path, queue: str, partition: int) -> int:
    return watermarks(data_dir, queue, partition)[1]


def truncate_slot_run(data_dir: Path, queue: str, group: str) -> int:
    """Cut the value of one of ``group``'s stored delivery runs (keys.SLOT_RUN) short, so that it
    cannot be read; -> the run's partition."""
    qid = queue_id(data_dir, queue)
    with _env(data_dir) as (txn, _batches, kv):
        gid = int(pb.Group.FromString(txn.get(keys.group_key(qid, group), db=kv)).group_id)
        prefix = keys.slot_run_prefix(gid)
        with txn.cursor(db=kv) as cursor:
            assert cursor.set_range(prefix) and cursor.key().startswith(prefix), (queue, group)
            key, value = cursor.key(), cursor.value()
        txn.put(key, value[: keys.SLOT_RUN_VALUE.size - 3], db=kv)
    return keys.split_slot_key(key)[1]
