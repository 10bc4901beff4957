"""Faults written into a stopped node's LMDB files with ``spec_codec`` (a codec written from
RECORD_BATCH.md alone), never through the project's record encoder or decoder: a producer
session's batch stored twice, a sequence gap, a dead letter stripped of its headers.

Each keeps the store otherwise consistent (a batch appended at the high watermark moves the
watermark and the size in the log's metadata), so exactly the rule meant to see the fault can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from tests.audit import spec_codec
from tests.audit.spec_codec import SpecBatch


@contextmanager
def _write(data_dir: Path, write: bool = True) -> Iterator[tuple[Any, Any, Any, Any]]:
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8)
    try:
        with env.begin(write=write) as txn:
            names = (b"batches", b"logmeta", b"kv")
            dbs = [env.open_db(name, txn=txn, create=False) for name in names]
            yield (txn, *dbs)
    finally:
        env.close()


def _position(log_id: int, base: int) -> bytes:
    return log_id.to_bytes(8, "big") + base.to_bytes(8, "big")


def _log_id(txn: Any, kv: Any, queue: str, partition: int) -> int:
    raw = txn.get(keys.queue_key(queue), db=kv)
    assert raw is not None, f"no queue {queue!r}"
    return keys.log_id(int(pb.Queue.FromString(raw).queue_id), partition)


def batches(data_dir: Path, queue: str, partition: int) -> list[SpecBatch]:
    """Every stored batch of the log, decoded (and crc-checked) by the spec codec."""
    with _write(data_dir, write=False) as (txn, bdb, _meta, kv):
        lid = _log_id(txn, kv, queue, partition)
        out = []
        with txn.cursor(db=bdb) as cursor:
            if cursor.set_range(_position(lid, 0)):
                for key, value in cursor:
                    if int.from_bytes(key[:8], "big") != lid:
                        break
                    out.append(spec_codec.decode(lid, int.from_bytes(key[8:], "big"), value))
    return out


def append_copy(data_dir: Path, queue: str, partition: int, base: int) -> tuple[int, int]:
    """The batch stored at ``base`` stored again at the high watermark, resealed there (same
    records, same producer session and sequences), the watermark moved over it: what a
    producer-session retry stored twice looks like. -> (first, last) offset of the copy."""
    with _write(data_dir) as (txn, bdb, meta_db, kv):
        lid = _log_id(txn, kv, queue, partition)
        source = spec_codec.decode(lid, base, txn.get(_position(lid, base), db=bdb))
        meta_key = keys.U64.pack(lid)
        low, high, size = spec_codec.decode_meta(lid, txn.get(meta_key, db=meta_db))
        copy = SpecBatch(
            high,
            source.records,
            source.producer_id,
            source.producer_epoch,
            source.first_sequence,
        )
        stored = spec_codec.encode(lid, copy)
        assert txn.put(_position(lid, high), stored, db=bdb, overwrite=False)
        count = len(copy.records)
        txn.put(
            meta_key,
            spec_codec.encode_meta(lid, low, high + count, size + len(stored)),
            db=meta_db,
        )
    return high, high + count - 1


def reseal(
    data_dir: Path, queue: str, partition: int, base: int, change: Callable[[SpecBatch], None]
) -> None:
    """The batch at ``base`` decoded, changed in place by ``change``, sealed again with a valid
    crc at the same place (its record count must stay); the log's size follows its length."""
    with _write(data_dir) as (txn, bdb, meta_db, kv):
        lid = _log_id(txn, kv, queue, partition)
        old = txn.get(_position(lid, base), db=bdb)
        batch = spec_codec.decode(lid, base, old)
        count = len(batch.records)
        change(batch)
        assert len(batch.records) == count and batch.base_offset == base
        new = spec_codec.encode(lid, batch)
        txn.put(_position(lid, base), new, db=bdb)
        meta_key = keys.U64.pack(lid)
        low, high, size = spec_codec.decode_meta(lid, txn.get(meta_key, db=meta_db))
        txn.put(
            meta_key, spec_codec.encode_meta(lid, low, high, size + len(new) - len(old)), db=meta_db
        )


def batch_at(data_dir: Path, queue: str, partition: int, offset: int) -> SpecBatch:
    """The stored batch holding ``offset``."""
    for batch in batches(data_dir, queue, partition):
        if batch.base_offset <= offset <= batch.last_offset:
            return batch
    raise AssertionError(f"no batch of {queue}/{partition} holds {offset}")


def edit_headers(
    data_dir: Path,
    queue: str,
    partition: int,
    offset: int,
    edit: Callable[[list[tuple[str, bytes]]], list[tuple[str, bytes]]],
) -> None:
    """The headers of one record replaced by ``edit(headers)`` (kept in ascending name order,
    as the broker stores them), its batch resealed."""
    base = batch_at(data_dir, queue, partition, offset).base_offset

    def change(batch: SpecBatch) -> None:
        record = batch.records[offset - base]
        record.headers = sorted(edit(list(record.headers)))

    reseal(data_dir, queue, partition, base, change)
