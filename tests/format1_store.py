"""Data written by record format 1, built by hand as the previous version laid it out.

An LMDB environment with the databases ``log`` (key = (log_id, offset) as 16 bytes big-endian,
value = ``storage.codec.encode`` of the record), ``logmeta`` (key = log_id u64 big-endian,
value = low, high, size_bytes u64 each and a crc32c over key and fields) and ``kv``; and a store
copy of it (compacted LMDB file, ``FLUXMQ-LMDB-COPY-1`` and the file's sha256), as a Raft
snapshot of that version holds it. Written from the layout, not through this version's store,
so the tests prove the migration reads what the old code wrote.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field

import lmdb
from crc32c import crc32c

from fluxmq.core import keys
from storage import LmdbStore, NewRecord
from storage.codec import encode, position

_META_KEY = struct.Struct(">Q")
_META_FIELDS = struct.Struct(">QQQ")
_META_CRC = struct.Struct(">I")
COPY_MAGIC = b"FLUXMQ-LMDB-COPY-1"
MAP_SIZE_BYTES = 1 << 30


@dataclass
class Format1Log:
    """A log whose records below ``low`` were truncated (format 1 deleted their rows)."""

    low: int
    records: list[NewRecord]

    @property
    def high(self) -> int:
        return self.low + len(self.records)


@dataclass
class Format1Content:
    logs: dict[int, Format1Log] = field(default_factory=dict)
    kv: dict[bytes, bytes] = field(default_factory=dict)


def meta_value(log_id: int, low: int, high: int, size_bytes: int) -> bytes:
    key = _META_KEY.pack(log_id)
    fields = _META_FIELDS.pack(low, high, size_bytes)
    return fields + _META_CRC.pack(crc32c(fields, crc32c(key)))


def sample_content() -> Format1Content:
    """Logs as a broker leaves them: several queues' partitions with keys, headers,
    idempotency keys, a log truncated by retention, a log emptied by it; and the kv rows of its
    state (applied index, catalog counters, a queue, a dedup row)."""
    base_ms = 1_700_000_000_000
    orders = [
        NewRecord(
            timestamp_ms=base_ms + i // 3,
            value=f"order-{i}".encode() * (1 + i % 5),
            key=None if i % 4 == 0 else f"customer-{i % 7}".encode(),
            headers=(("trace", f"t{i}".encode()),) if i % 3 == 0 else (),
            idempotency_key=f"idem-{i}" if i % 2 == 0 else None,
        )
        for i in range(250)
    ]
    truncated = [
        NewRecord(timestamp_ms=base_ms + 10 * i, value=b"x" * (i % 50), key=b"") for i in range(40)
    ]
    return Format1Content(
        logs={
            keys.log_id(1, 0): Format1Log(0, orders),
            keys.log_id(1, 1): Format1Log(17, truncated),
            keys.log_id(2, 0): Format1Log(5, []),  # emptied by retention: low == high == 5
        },
        kv={
            keys.APPLIED: keys.U64.pack(4242),
            keys.NEXT_QUEUE_ID: keys.U64.pack(3),
            keys.queue_key("orders"): b"\x0a\x06orders\x10\x02",
            keys.dedup_key(1, "idem-0"): keys.DEDUP_VALUE.pack(0, 0, base_ms),
        },
    )


def write_env(path: str, content: Format1Content) -> None:
    """A format-1 LMDB environment in directory ``path`` holding ``content``."""
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True) as txn:
            log_db = env.open_db(b"log", txn=txn)
            meta_db = env.open_db(b"logmeta", txn=txn)
            kv_db = env.open_db(b"kv", txn=txn)
            for log_id, log in content.logs.items():
                size = 0
                for index, record in enumerate(log.records):
                    row = encode(log_id, log.low + index, record)
                    txn.put(position(log_id, log.low + index), row, db=log_db)
                    size += len(row)
                txn.put(
                    _META_KEY.pack(log_id), meta_value(log_id, log.low, log.high, size), db=meta_db
                )
            for key, value in content.kv.items():
                txn.put(key, value, db=kv_db)
    finally:
        env.close()


def write_copy(env_path: str, copy_path: str) -> None:
    """A store copy of the environment at ``env_path``, in the copy format of that version."""
    env = lmdb.open(env_path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True)
    try:
        fd = os.open(copy_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            env.copyfd(fd, compact=True)
            size = os.fstat(fd).st_size
            digest = hashlib.sha256(os.pread(fd, size, 0)).digest()
            os.pwrite(fd, COPY_MAGIC + digest, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        env.close()


def row_at(path: str, log_id: int, offset: int) -> bytes:
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True, readonly=True)
    try:
        with env.begin() as txn:
            value = txn.get(position(log_id, offset), db=env.open_db(b"log", txn=txn, create=False))
    finally:
        env.close()
    assert value is not None
    return bytes(value)


def put_row(path: str, log_id: int, offset: int, row: bytes) -> None:
    """Overwrite (or add) one format-1 row, as damage or a stray write would."""
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.put(position(log_id, offset), row, db=env.open_db(b"log", txn=txn))
    finally:
        env.close()


def delete_row(path: str, log_id: int, offset: int) -> None:
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True) as txn:
            assert txn.delete(position(log_id, offset), db=env.open_db(b"log", txn=txn))
    finally:
        env.close()


def db_names(path: str) -> set[bytes]:
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=8, subdir=True, readonly=True)
    try:
        with env.begin() as txn, txn.cursor() as cursor:
            return {bytes(key) for key, _value in cursor}
    finally:
        env.close()


def assert_store_holds(store: LmdbStore, content: Format1Content) -> None:
    """Every log's watermarks and every record, and the key/value table byte for byte."""
    with store.read() as txn:
        for log_id, log in content.logs.items():
            reader = txn.log(log_id)
            marks = reader.watermarks()
            assert (marks.low, marks.high) == (log.low, log.high), log_id
            got = []
            offset = log.low
            while offset < log.high:
                chunk = reader.read(offset, 1000, 1 << 30)
                got.extend(chunk)
                offset = chunk[-1].offset + 1
            assert [r.offset for r in got] == list(range(log.low, log.high)), log_id
            assert [
                NewRecord(r.timestamp_ms, r.value, r.key, r.headers, r.idempotency_key) for r in got
            ] == log.records, log_id
        assert dict(txn.scan(b"")) == content.kv
