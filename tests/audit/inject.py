"""Damage to a copied data directory, one kind at a time, written straight into its LMDB files
(the broker is stopped; nothing here goes through the state machine)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from storage.api import NewRecord, Record
from storage.codec import decode, encode, position

HEAD_BYTES = 25  # crc, format, timestamp, key length, value length, header count, idem length


@contextmanager
def _env(data_dir: Path) -> Iterator[tuple[Any, Any, Any]]:
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            yield txn, env.open_db(b"log", txn=txn), env.open_db(b"kv", txn=txn)
    finally:
        env.close()


def queue_id(data_dir: Path, queue: str) -> int:
    with _env(data_dir) as (txn, _log, kv):
        raw = txn.get(keys.queue_key(queue), db=kv)
    assert raw is not None, f"{data_dir} has no queue {queue!r}"
    return int(pb.Queue.FromString(raw).queue_id)


def read(data_dir: Path, queue: str, partition: int, offset: int) -> Record:
    lid = keys.log_id(queue_id(data_dir, queue), partition)
    with _env(data_dir) as (txn, log, _kv):
        raw = txn.get(position(lid, offset), db=log)
    assert raw is not None, (queue, partition, offset)
    return decode(lid, offset, bytes(raw))


def flip_value_byte(data_dir: Path, queue: str, partition: int, offset: int) -> None:
    """Bit rot: one byte of the value changes, the stored crc does not."""
    lid = keys.log_id(queue_id(data_dir, queue), partition)
    with _env(data_dir) as (txn, log, _kv):
        pos = position(lid, offset)
        buf = bytearray(txn.get(pos, db=log))
        key_len = int.from_bytes(buf[13:17], "big")
        at = HEAD_BYTES + (0 if key_len == 0xFFFFFFFF else key_len)
        buf[at] ^= 0x01
        txn.put(pos, bytes(buf), db=log)


def delete_offset(data_dir: Path, queue: str, partition: int, offset: int) -> None:
    """A lost record: its key is gone, the watermarks still cover it."""
    lid = keys.log_id(queue_id(data_dir, queue), partition)
    with _env(data_dir) as (txn, log, _kv):
        assert txn.delete(position(lid, offset), db=log)


def rewrite(data_dir: Path, queue: str, partition: int, offset: int, **changes: Any) -> Record:
    """Replace a record by an intact one (valid crc) with ``changes``: a replica that wrote
    something else, or a bug that stored what it should not have."""
    old = read(data_dir, queue, partition, offset)
    lid = keys.log_id(queue_id(data_dir, queue), partition)
    new = NewRecord(
        timestamp_ms=old.timestamp_ms,
        value=old.value,
        key=old.key,
        headers=old.headers,
        idempotency_key=old.idempotency_key,
    )
    new = replace(new, **changes)
    with _env(data_dir) as (txn, log, _kv):
        txn.put(position(lid, offset), encode(lid, offset, new), db=log)
    return old


def set_header(data_dir: Path, queue: str, partition: int, offset: int, name: str, value: bytes):
    old = read(data_dir, queue, partition, offset)
    headers = tuple(sorted((*(h for h in old.headers if h[0] != name), (name, value))))
    rewrite(data_dir, queue, partition, offset, headers=headers)


GROUP_ROW_FIELDS = ("committed", "next", "acked", "dead", "filtered", "skipped", "purged", "base")


def edit_group_row(data_dir: Path, queue: str, group: str, partition: int, **fields: int) -> None:
    """Overwrite fields of a group partition's stored row (see keys.PARTITION_VALUE)."""
    qid = queue_id(data_dir, queue)
    with _env(data_dir) as (txn, _log, kv):
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
    with _env(data_dir) as (txn, _log, kv):
        gid = int(pb.Group.FromString(txn.get(keys.group_key(qid, group), db=kv)).group_id)
        raw = txn.get(keys.group_partition_key(gid, partition), db=kv)
    return dict(zip(GROUP_ROW_FIELDS, keys.PARTITION_VALUE.unpack(raw), strict=True))


def high(data_dir: Path, queue: str, partition: int) -> int:
    lid = keys.log_id(queue_id(data_dir, queue), partition)
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin() as txn:
            raw = txn.get(keys.U64.pack(lid), db=env.open_db(b"logmeta", txn=txn))
    finally:
        env.close()
    assert raw is not None
    return int.from_bytes(raw[8:16], "big")
