"""Rewriting a store of record format 1 (one LMDB row per record) as record batches (format 2).

``LmdbStore`` refuses an environment that still holds the format-1 ``log`` database
(``OldFormatError``); this module rewrites one, offline (no process may hold it open), in place:

* ``migrate_environment(path)``: one LMDB write transaction reads every log's format-1 rows
  [low, high), checks each (crc, position, no row missing, none outside the watermarks), groups
  consecutive records into batches (``record_batch.encode``: each record keeps its timestamp),
  writes them into ``batches`` at ``codec.position(log_id, base)``, rewrites each log's metadata
  with the same watermarks and the new ``size_bytes``, drops ``log`` and commits. A crash at any
  point before the commit leaves the environment exactly as it was; a refused row aborts the
  transaction and changes nothing. An environment without ``log`` is format 2 already: nothing is
  done, so running the migration twice is harmless.
* ``migrate_copy(src, dst)``: the same for a store copy (``LmdbStore.copy_to``'s file, as held in
  a Raft snapshot), rewritten into a new copy file.

The node must be stopped: a store another process holds open is refused
(``environment_in_use``: LMDB's lock file), but nothing stops a node from starting during the
migration, which the operator must not do.

Every batch is decoded and compared with the records it came from before the commit, and after
it the result is opened with ``LmdbStore`` and read back in full: every log's watermarks and
every record (offset, timestamp, value, key, headers, idempotency key) must match a fingerprint
taken of the source, and the key/value table must be byte-identical.

Batches of a migrated log: one per record. Format 1 kept no trace of which records a publish
wrote together, and a Raft replica that stopped behind the others replays its last format-1 log
entries after the migration: the state machine stores records that come one by one (format 1)
one batch each, so a replica that migrated a record and one that replayed it hold the same
batch, and the replicas' digests and byte retention agree.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lmdb
from crc32c import crc32c

from storage import record_batch, unsynced_marker
from storage.api import NewRecord, Record, StorageError
from storage.codec import decode_at, encode, position
from storage.lmdb_store import (
    DB_NAMES,
    DEFAULT_MAP_SIZE_BYTES,
    FORMAT_1_DB,
    META_CRC,
    META_FIELDS,
    LmdbStore,
    check_copy_file,
    log_metas,
    unpack_meta,
)

BATCH_RECORDS_MAX = 1  # see the module docstring: what replaying a format-1 entry stores
BATCH_BYTES_MAX = 1024 * 1024
TEMP_PREFIX = ".fluxmq-migrate-"

_BATCHES_DB, _META_DB, _KV_DB = DB_NAMES
_ROW_KEY = struct.Struct(">QQ")
_KV_LENGTHS = struct.Struct(">II")
_VERIFY_READ_RECORDS = 1000
_VERIFY_READ_BYTES = 16 * 1024 * 1024


class MigrationError(StorageError):
    """The migration was refused (damaged or unexpected data, a store in use); nothing was
    changed."""


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What one migration did. ``migrated`` is False when the store was format 2 already (then
    the counts are 0: nothing was read or written)."""

    path: str
    migrated: bool
    logs: int = 0
    records: int = 0
    batches: int = 0
    bytes_before: int = 0  # the format-1 rows
    bytes_after: int = 0  # the batches
    skipped: str = ""  # why a format-1 store was left as it is ('' when it was not)

    def describe(self) -> str:
        if self.skipped:
            return f"{self.path}: {self.skipped}"
        if not self.migrated:
            return f"{self.path}: already format 2, nothing to do"
        return (
            f"{self.path}: migrated to format 2: {self.logs} logs, {self.records} records in "
            f"{self.batches} batches, {self.bytes_before} bytes of rows -> "
            f"{self.bytes_after} bytes of batches"
        )


@dataclass(frozen=True, slots=True)
class _LogPrint:
    """A log as the source held it: its watermarks and a fingerprint of its records."""

    log_id: int
    low: int
    high: int
    records_sha256: bytes


@dataclass(frozen=True, slots=True)
class _Converted:
    logs: list[_LogPrint]
    kv_sha256: bytes
    records: int
    batches: int
    bytes_before: int
    bytes_after: int


# Public entry points.


def environment_in_use(path: str) -> bool:
    """Whether a process holds the LMDB environment in directory ``path`` open.

    Every process that opens an environment keeps a shared fcntl lock on byte 0 of its
    ``lock.mdb`` for as long as it is open; an exclusive lock is granted only when no other
    process has one. Call it before opening the environment in this process: closing the probe's
    descriptor drops every fcntl lock this process holds on the file, LMDB's included.
    """
    try:
        fd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise MigrationError(f"cannot check whether {path!r} is in use: {e}") from e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise MigrationError(f"cannot check whether {path!r} is in use: {e}") from e
    finally:
        os.close(fd)
    return False


def migrate_environment(path: str) -> MigrationReport:
    """Rewrite the LMDB environment in directory ``path`` from record format 1 to format 2, in
    place, in one write transaction (see the module docstring). ``MigrationError`` when it is
    refused; the environment is then unchanged."""
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        raise MigrationError(f"{path!r} holds no LMDB environment (no data.mdb)")
    if environment_in_use(path):
        raise MigrationError(
            f"the store at {path!r} is open in another process (a running node?): stop the "
            "node first; nothing was changed"
        )
    skipped = _discarded_at_start(path)
    if skipped:
        return MigrationReport(path, migrated=False, skipped=skipped)
    converted = _migrate_in_place(path)
    if converted is None:
        return MigrationReport(path, migrated=False)
    try:
        _verify(path, converted)
    except StorageError as e:
        raise MigrationError(
            f"{path!r} was rewritten, but reading it back failed: {e}. Keep the node stopped "
            "and restore the data directory from a backup"
        ) from e
    return _report(path, converted)


def _discarded_at_start(path: str) -> str:
    """Why the store need not be migrated: it was left unsynced by an earlier boot, so the node
    discards it when it starts (``unsynced_marker``) and rebuilds it from its Raft log, and
    after a machine crash its pages may be torn. '' when it must be migrated."""
    marked = unsynced_marker.marked_boot_id(path)
    if marked is None or marked == unsynced_marker.current_boot_id():
        return ""
    return (
        "left unsynced by an earlier boot: the node discards it at start and rebuilds it from "
        "its Raft snapshot and journal, so it is not migrated"
    )


def copy_format(path: str) -> int:
    """The record format (1 or 2) of the store copy ``path`` (``LmdbStore.copy_to``'s file),
    after checking its sha256 trailer."""
    with _open_copy(path) as (_env, txn):
        return 1 if FORMAT_1_DB in _db_names(txn) else 2


def migrate_copy(src_copy_file: str, dst_copy_file: str) -> MigrationReport:
    """Write to the new file ``dst_copy_file`` a copy of the format-1 store copy
    ``src_copy_file`` rewritten as format 2 (``LmdbStore.copy_to``'s format: what
    ``LmdbStore.replace_from`` accepts). ``MigrationError`` when refused (then no destination
    file is left behind)."""
    parent = os.path.dirname(os.path.abspath(dst_copy_file))
    with _open_copy(src_copy_file) as (src_env, src_txn):
        names = _db_names(src_txn)
        if FORMAT_1_DB not in names:
            raise MigrationError(f"the copy {src_copy_file!r} holds format 2 already")
        try:
            work = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
        except OSError as e:
            raise MigrationError(f"cannot make a work directory in {parent!r}: {e}") from e
        try:
            converted = _convert_copy(src_copy_file, src_env, src_txn, names, work)
            _verify(work, converted)
            store = LmdbStore(work, sync=False)
            try:
                store.copy_to(dst_copy_file)
            finally:
                store.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return _report(src_copy_file, converted)


# In place.


def _migrate_in_place(path: str) -> _Converted | None:
    data_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
    try:
        env = lmdb.open(
            path,
            # The old rows stay until the commit, so the batches need room beside them.
            map_size=max(DEFAULT_MAP_SIZE_BYTES, 3 * data_bytes),
            subdir=True,
            max_dbs=8,
            readahead=False,
            lock=True,
        )
    except lmdb.Error as e:
        raise MigrationError(f"cannot open the LMDB environment at {path!r}: {e}") from e
    try:
        with env.begin(write=True) as txn:
            names = _db_names(txn)
            if FORMAT_1_DB not in names:
                return None
            _check_names(path, names)
            dbs = _open_dbs(env, txn, create=True)
            converted = _convert(path, txn, dbs, txn, dbs, copy_kv=False)
            txn.drop(dbs.log, delete=True)
        return converted
    except lmdb.Error as e:
        raise MigrationError(f"cannot migrate {path!r}: LMDB: {e}; nothing was changed") from e
    finally:
        env.close()


# Copies.


@contextlib.contextmanager
def _open_copy(path: str) -> Iterator[tuple[Any, Any]]:
    """The checked copy file ``path`` as a read-only environment and a read transaction."""
    try:
        data_bytes = check_copy_file(path)
    except StorageError as e:
        raise MigrationError(str(e)) from e
    try:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=8, readahead=False)
    except lmdb.Error as e:
        raise MigrationError(f"{path!r} is not a copy of an LMDB store: {e}") from e
    try:
        # Pages past the end of the file would be read outside it (SIGBUS), sha256 or not.
        pages_bytes = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if pages_bytes > data_bytes:
            raise MigrationError(
                f"{path!r} is not a usable copy: its pages need {pages_bytes} bytes, "
                f"it holds {data_bytes}"
            )
        with env.begin(write=False) as txn:
            yield env, txn
    except lmdb.Error as e:
        raise MigrationError(f"cannot read the copy {path!r}: {e}") from e
    finally:
        env.close()


def _convert_copy(
    src_path: str, src_env: Any, src_txn: Any, names: set[bytes], work: str
) -> _Converted:
    _check_names(src_path, names)
    src_dbs = _Dbs(
        log=src_env.open_db(FORMAT_1_DB, txn=src_txn, create=False),
        batches=None,
        meta=src_env.open_db(_META_DB, txn=src_txn, create=False),
        kv=src_env.open_db(_KV_DB, txn=src_txn, create=False),
    )
    data_bytes = os.path.getsize(src_path)
    try:
        # A scratch store that copy_to compacts and fsyncs at the end: no fsync on the way.
        env = lmdb.open(
            work,
            map_size=max(DEFAULT_MAP_SIZE_BYTES, 3 * data_bytes),
            subdir=True,
            max_dbs=8,
            sync=False,
            metasync=False,
            readahead=False,
        )
    except lmdb.Error as e:
        raise MigrationError(f"cannot make a work store in {work!r}: {e}") from e
    try:
        with env.begin(write=True) as txn:
            dst_dbs = _open_dbs(env, txn, create=True)
            return _convert(src_path, src_txn, src_dbs, txn, dst_dbs, copy_kv=True)
    except lmdb.Error as e:
        raise MigrationError(f"cannot migrate the copy {src_path!r}: LMDB: {e}") from e
    finally:
        env.close()


# The conversion.


class _Dbs:
    """Database handles: ``log`` (format 1, None when absent), ``batches``, ``logmeta``, ``kv``."""

    __slots__ = ("batches", "kv", "log", "meta")

    def __init__(self, log: Any, batches: Any, meta: Any, kv: Any) -> None:
        self.log = log
        self.batches = batches
        self.meta = meta
        self.kv = kv


def _db_names(txn: Any) -> set[bytes]:
    with txn.cursor() as cursor:
        return {key for key, _value in cursor}


def _check_names(path: str, names: set[bytes]) -> None:
    unknown = names - {FORMAT_1_DB, *DB_NAMES}
    if unknown:
        raise MigrationError(
            f"{path!r} holds databases this migration does not know: {sorted(unknown)!r}"
        )


def _open_dbs(env: Any, txn: Any, create: bool) -> _Dbs:
    names = _db_names(txn)
    return _Dbs(
        log=env.open_db(FORMAT_1_DB, txn=txn, create=False) if FORMAT_1_DB in names else None,
        batches=env.open_db(_BATCHES_DB, txn=txn, create=create),
        meta=env.open_db(_META_DB, txn=txn, create=create),
        kv=env.open_db(_KV_DB, txn=txn, create=create),
    )


def _convert(
    path: str, src: Any, src_dbs: _Dbs, dst: Any, dst_dbs: _Dbs, copy_kv: bool
) -> _Converted:
    """Write the batches and metadata of every format-1 log of ``src`` into ``dst`` (which may
    be the same transaction), checking every row; -> the source's fingerprints and counts."""
    if dst.stat(dst_dbs.batches)["entries"]:
        raise MigrationError(f"{path!r} holds both format-1 rows and batches: refusing to mix them")
    try:
        metas = [
            (log_id, key, low, high, size)
            for log_id, key, _v, low, high, size in log_metas(src, src_dbs.meta)
        ]
    except StorageError as e:
        raise MigrationError(f"cannot migrate {path!r}: {e}; nothing was changed") from e
    windows = {log_id: (low, high) for log_id, _key, low, high, _size in metas}
    prints: list[_LogPrint] = []
    records = batches = bytes_before = bytes_after = 0
    with src.cursor(db=src_dbs.log) as cursor:
        rows = _RowWalk(path, cursor, windows)
        for log_id, meta_key, low, high, size in metas:
            writer = _BatchWriter(path, dst, dst_dbs.batches, log_id)
            fingerprint = hashlib.sha256()
            row_bytes = 0
            for offset in range(low, high):
                row = rows.take(log_id, offset)
                pos = position(log_id, offset)
                record = _decoded(path, pos, log_id, offset, row)
                fingerprint.update(row)
                row_bytes += len(row)
                writer.add(record, len(row))
            writer.flush()
            if row_bytes != size:
                raise MigrationError(
                    f"cannot migrate {path!r}: log {log_id} holds {row_bytes} bytes of rows, its "
                    f"metadata says {size}; nothing was changed"
                )
            dst.put(
                meta_key, _meta_value(log_id, meta_key, low, high, writer.bytes), db=dst_dbs.meta
            )
            prints.append(_LogPrint(log_id, low, high, fingerprint.digest()))
            records += high - low
            batches += writer.batches
            bytes_before += row_bytes
            bytes_after += writer.bytes
        rows.finish()
    kv_sha256 = _copy_kv(src, src_dbs.kv, dst, dst_dbs.kv, copy_kv)
    return _Converted(prints, kv_sha256, records, batches, bytes_before, bytes_after)


def _decoded(path: str, pos: bytes, log_id: int, offset: int, row: bytes) -> Record:
    try:
        return decode_at(pos, log_id, offset, row)
    except StorageError as e:
        raise MigrationError(f"cannot migrate {path!r}: {e}; nothing was changed") from e


def _meta_value(log_id: int, meta_key: bytes, low: int, high: int, size: int) -> bytes:
    """A log's metadata entry, in LmdbStore's layout, checked by LmdbStore's own reader."""
    fields = META_FIELDS.pack(low, high, size)
    value = fields + META_CRC.pack(crc32c(fields, crc32c(meta_key)))
    unpack_meta(log_id, meta_key, value)
    return value


def _copy_kv(src: Any, src_db: object, dst: Any, dst_db: object, copy: bool) -> bytes:
    """sha256 of the key/value table (each pair length-prefixed), copied into ``dst`` when
    ``copy`` (in place it stays where it is)."""
    digest = hashlib.sha256()
    with src.cursor(db=src_db) as cursor:
        for key, value in cursor:
            _kv_update(digest, key, value)
            if copy:
                dst.put(key, value, db=dst_db, append=True)
    return digest.digest()


def _kv_update(digest: Any, key: bytes, value: bytes) -> None:
    digest.update(_KV_LENGTHS.pack(len(key), len(value)))
    digest.update(key)
    digest.update(value)


class _RowWalk:
    """One ordered pass over the format-1 rows, taking them in the order the logs' windows
    expect: a row where none is expected lies outside every log's [low, high) and is refused,
    as is an expected row that is missing."""

    __slots__ = ("_cursor", "_found", "_path", "_windows")

    def __init__(self, path: str, cursor: Any, windows: dict[int, tuple[int, int]]) -> None:
        self._path = path
        self._cursor = cursor
        self._windows = windows
        self._found: bool = cursor.first()

    def take(self, log_id: int, offset: int) -> bytes:
        pos = position(log_id, offset)
        if self._found:
            key: bytes = self._cursor.key()
            if key == pos:
                row: bytes = self._cursor.value()
                self._found = self._cursor.next()
                return row
            if key < pos:
                raise self._outside(key)
        raise MigrationError(
            f"cannot migrate {self._path!r}: log {log_id} has no row at offset {offset}, below "
            f"its high watermark {self._windows[log_id][1]}; nothing was changed"
        )

    def finish(self) -> None:
        if self._found:
            raise self._outside(self._cursor.key())

    def _outside(self, key: bytes) -> MigrationError:
        if len(key) != _ROW_KEY.size:
            detail = f"a row key has {len(key)} bytes, not {_ROW_KEY.size}"
        else:
            log_id, offset = _ROW_KEY.unpack(key)
            window = self._windows.get(log_id)
            if window is None:
                detail = f"log {log_id} has a row at offset {offset} but no metadata"
            else:
                detail = (
                    f"log {log_id} has a row at offset {offset}, outside its "
                    f"[low, high) = [{window[0]}, {window[1]})"
                )
        return MigrationError(f"cannot migrate {self._path!r}: {detail}; nothing was changed")


class _BatchWriter:
    """Groups one log's consecutive records into batches and writes them, each checked by
    decoding it back before it is written."""

    __slots__ = (
        "_db",
        "_log_id",
        "_path",
        "_pending",
        "_pending_bytes",
        "_txn",
        "batches",
        "bytes",
    )

    def __init__(self, path: str, txn: Any, db: object, log_id: int) -> None:
        self._path = path
        self._txn = txn
        self._db = db
        self._log_id = log_id
        self._pending: list[Record] = []
        self._pending_bytes = 0
        self.batches = 0
        self.bytes = 0

    def add(self, record: Record, row_bytes: int) -> None:
        if self._pending and not self._fits(record, row_bytes):
            self.flush()
        self._pending.append(record)
        # A format-1 row is a little longer than the record's share of a batch: a safe bound.
        self._pending_bytes += row_bytes

    def _fits(self, record: Record, row_bytes: int) -> bool:
        pending = self._pending
        return (
            len(pending) < BATCH_RECORDS_MAX
            and self._pending_bytes + row_bytes <= BATCH_BYTES_MAX
            and record.timestamp_ms >= pending[-1].timestamp_ms
            and record.timestamp_ms - pending[0].timestamp_ms <= record_batch.U32_MAX
        )

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        log_id = self._log_id
        base = pending[0].offset
        stored = record_batch.encode(log_id, base, [_new_record(r) for r in pending])
        decoded = record_batch.decode(log_id, base, stored)
        if [_fields(r) for r in decoded] != [_fields(r) for r in pending]:
            raise MigrationError(
                f"cannot migrate {self._path!r}: the batch of log {log_id} at {base} does not "
                "decode to the records it was made of; nothing was changed"
            )
        if not self._txn.put(
            position(log_id, base), stored, db=self._db, overwrite=False, append=True
        ):
            raise MigrationError(
                f"cannot migrate {self._path!r}: log {log_id} already has a batch at {base}"
            )
        self.batches += 1
        self.bytes += len(stored)
        self._pending = []
        self._pending_bytes = 0


def _new_record(record: Record) -> NewRecord:
    return NewRecord(
        record.timestamp_ms, record.value, record.key, record.headers, record.idempotency_key
    )


def _fields(record: Record) -> tuple[object, ...]:
    return (
        record.offset,
        record.timestamp_ms,
        record.value,
        record.key,
        record.headers,
        record.idempotency_key,
    )


# Reading the result back.


def _verify(path: str, converted: _Converted) -> None:
    """Open the migrated store with ``LmdbStore`` and compare all of it with the source's
    fingerprints; a difference raises ``MigrationError``."""
    store = LmdbStore(path, sync=False)
    try:
        with store.read() as txn:
            for log in converted.logs:
                _verify_log(path, txn, log)
            digest = hashlib.sha256()
            for key, value in txn.scan(b""):
                _kv_update(digest, key, value)
            if digest.digest() != converted.kv_sha256:
                raise MigrationError(f"{path!r}: the key/value table differs from the source")
    finally:
        store.close()


def _verify_log(path: str, txn: Any, log: _LogPrint) -> None:
    reader = txn.log(log.log_id)
    marks = reader.watermarks()
    if (marks.low, marks.high) != (log.low, log.high):
        raise MigrationError(
            f"{path!r}: log {log.log_id} reads back [{marks.low}, {marks.high}), the source had "
            f"[{log.low}, {log.high})"
        )
    fingerprint = hashlib.sha256()
    offset = log.low
    while offset < log.high:
        for record in reader.read(offset, _VERIFY_READ_RECORDS, _VERIFY_READ_BYTES):
            if record.offset != offset:
                raise MigrationError(
                    f"{path!r}: log {log.log_id} reads back offset {record.offset} where "
                    f"{offset} was expected"
                )
            fingerprint.update(encode(log.log_id, offset, _new_record(record)))
            offset += 1
    if fingerprint.digest() != log.records_sha256:
        raise MigrationError(
            f"{path!r}: the records of log {log.log_id} read back differ from the source"
        )


def _report(path: str, converted: _Converted) -> MigrationReport:
    return MigrationReport(
        path,
        migrated=True,
        logs=len(converted.logs),
        records=converted.records,
        batches=converted.batches,
        bytes_before=converted.bytes_before,
        bytes_after=converted.bytes_after,
    )
