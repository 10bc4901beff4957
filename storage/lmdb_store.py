"""The durable store: one LMDB environment per data directory.

Three named databases live in the environment:

``batches``
    key = (log_id, base offset) as 16 bytes big-endian, value = a sealed record batch (see
    ``record_batch``, format 2). Big-endian keys make LMDB's byte order the numeric order, so one
    log is one contiguous key range and reading it is a sequential cursor walk; the batch holding
    an offset is the one at or just before the offset's key. The batches of a log tile
    [its first batch's base, high) without gaps or overlaps, and the first one holds ``low``.
``logmeta``
    key = log_id as 8 bytes big-endian, value = low, high, size_bytes (u64 each) and a crc32c of
    key and fields. The watermarks steer every read and truncation, so a damaged entry must be
    refused like a damaged record, never used. A log without an entry has never been written, or
    has been dropped.
``kv``
    The opaque key/value table of the transactions.

Each transaction object is confined to the thread that opened it (LMDB write transactions are
bound to their thread; py-lmdb opens the environment with MDB_NOTLS so read transactions may be
opened from any thread and run concurrently with the writer).

A copy (``copy_to``) is a compacted LMDB data file holding the same three databases, followed by
a trailer: ``FLUXMQ-LMDB-COPY-1`` and the sha256 of the data file. LMDB checksums no pages, and
a short or damaged data file makes it read outside the file (SIGBUS) or follow garbage
pointers, so ``replace_from`` checks the whole file against its sha256 before LMDB sees it.
The copy is then read as a separate read-only environment (LMDB ignores the trailing bytes) and
never becomes the live one, so the live environment is never closed under its readers.

An environment written by record format 1 (a ``log`` database: one row per record) is refused
at open with ``OldFormatError``; ``storage.migrate`` rewrites it (``fluxmq migrate``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import lmdb
from crc32c import crc32c

from storage import record_batch, unsynced_marker
from storage.api import (
    ContentDigest,
    CorruptRecordError,
    NewRecord,
    OffsetOutOfRangeError,
    OldFormatError,
    Record,
    StorageBusyError,
    StorageError,
    StorageFullError,
    StoredBatch,
    StoreStat,
    TruncateResult,
    Watermarks,
)
from storage.codec import (
    KV_KEY_BYTES_MAX,
    KV_VALUE_BYTES_MAX,
    check_append_room,
    check_chunk,
    check_kv_key,
    check_kv_value,
    check_log_id,
    check_offset,
    check_read_limits,
    check_scan,
    position,
)
from storage.record_batch import BatchHeader, CorruptBatchError

if TYPE_CHECKING:
    from storage.api import PartitionLog, PartitionLogReader, ReadTxn, Store, WriteTxn

DEFAULT_MAP_SIZE_BYTES = 64 * 1024**3
MAX_READERS = 256

META_KEY = struct.Struct(">Q")
META_FIELDS = struct.Struct(">QQQ")
META_CRC = struct.Struct(">I")
_META_SIZE = META_FIELDS.size + META_CRC.size

# The databases a copy must hold; anything else in a file handed to replace_from is refused.
DB_NAMES = (b"batches", b"logmeta", b"kv")
FORMAT_1_DB = b"log"  # record format 1: one row per record
_LOG_PREFIX = struct.Struct(">Q")
_COPY_MAGIC = b"FLUXMQ-LMDB-COPY-1"
_COPY_TRAILER_BYTES = len(_COPY_MAGIC) + hashlib.sha256().digest_size
_HASH_CHUNK_BYTES = 1024 * 1024

_ENDED = "the transaction has ended"
_FAILED = "an earlier operation of this write transaction failed; it can only be aborted"


def unpack_meta(log_id: int, meta_key: bytes, raw: bytes) -> tuple[int, int, int]:
    """(low, high, size_bytes) of a stored metadata entry, checked."""
    if len(raw) != _META_SIZE:
        raise StorageError(f"metadata of log {log_id} has {len(raw)} bytes")
    fields = raw[: META_FIELDS.size]
    if crc32c(fields, crc32c(meta_key)) != META_CRC.unpack_from(raw, len(fields))[0]:
        raise StorageError(f"metadata of log {log_id} failed its crc32c check")
    low, high, size = META_FIELDS.unpack(fields)
    if low > high or (size == 0) != (low == high):
        raise StorageError(
            f"metadata of log {log_id} is inconsistent: low={low} high={high} size_bytes={size}"
        )
    return low, high, size


def log_metas(txn: Any, meta_db: object) -> Iterator[tuple[int, bytes, bytes, int, int, int]]:
    """(log_id, meta key, meta value, low, high, size_bytes) of every log, by log_id."""
    with txn.cursor(db=meta_db) as cursor:
        for key, value in cursor:
            if len(key) != META_KEY.size:
                raise StorageError(f"a log metadata key has {len(key)} bytes")
            log_id = META_KEY.unpack(key)[0]
            low, high, size = unpack_meta(log_id, key, value)
            yield log_id, key, value, low, high, size


def _log_batches(
    txn: Any, batches_db: object, log_id: int, low: int, high: int, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, bytes, bytes]]:
    """(header, key, stored batch) of the batches that hold [low, high) of one log, in order,
    checking that they tile it: a missing or overlapping batch raises ``CorruptRecordError``."""
    if low == high:
        return
    with txn.cursor(db=batches_db) as cursor:
        found = _seek_batch(cursor, log_id, low)
        offset = low
        while found:
            key, value = cursor.item()
            base = _base_of(key, log_id)
            # The first batch holds low; each next one starts where the one before ended.
            if base is None or base > offset or (base < offset and offset != low):
                if base is not None and base < offset:
                    raise CorruptRecordError(
                        log_id, base, f"a batch at {base} overlaps the one before (to {offset - 1})"
                    )
                break
            header = record_batch.read_header(log_id, base, value, check_crc)
            if header.last_offset < offset:
                break
            yield header, key, value
            offset = header.last_offset + 1
            if offset >= high:
                if offset > high:
                    raise CorruptRecordError(
                        log_id, base, f"a batch runs to {header.last_offset}, past high {high}"
                    )
                return
            found = cursor.next()
    raise CorruptRecordError(log_id, offset, "batch missing below high")


def _seek_batch(cursor: Any, log_id: int, offset: int) -> bool:
    """Put ``cursor`` on the batch of ``log_id`` at or just before ``offset``'s key (the one
    that holds ``offset`` when the log is sound); False when there is none."""
    pos = position(log_id, offset)
    if cursor.set_range(pos):
        if cursor.key() == pos:
            return True
        if not cursor.prev():
            return False
    elif not cursor.last():
        return False
    return _base_of(cursor.key(), log_id) is not None


def _base_of(key: bytes, log_id: int) -> int | None:
    """The base offset of a batch key of ``log_id`` (None: another log's key)."""
    if len(key) != 16 or _LOG_PREFIX.unpack_from(key)[0] != log_id:
        return None
    base: int = _LOG_PREFIX.unpack_from(key, 8)[0]
    return base


def _file_sha256(fd: int, size_bytes: int) -> bytes:
    """sha256 of the first ``size_bytes`` of the file, read in bounded chunks."""
    digest = hashlib.sha256()
    at = 0
    while at < size_bytes:
        chunk = os.pread(fd, min(_HASH_CHUNK_BYTES, size_bytes - at), at)
        if not chunk:
            raise OSError(f"the file ended at {at} of {size_bytes} bytes while being hashed")
        digest.update(chunk)
        at += len(chunk)
    return digest.digest()


def check_copy_file(path: str) -> int:
    """Check a copy against its trailer; return the size of its LMDB data file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise StorageError(f"cannot open the copy {path!r}: {e}") from e
    try:
        size = os.fstat(fd).st_size
        data_bytes = size - _COPY_TRAILER_BYTES
        if data_bytes <= 0:
            raise StorageError(f"{path!r} is not a copy of an LMDB store: {size} bytes")
        trailer = os.pread(fd, _COPY_TRAILER_BYTES, data_bytes)
        if not trailer.startswith(_COPY_MAGIC):
            raise StorageError(f"{path!r} is not a copy of an LMDB store: no copy trailer")
        if trailer[len(_COPY_MAGIC) :] != _file_sha256(fd, data_bytes):
            raise StorageError(f"the copy {path!r} is damaged: its sha256 does not match")
    except OSError as e:
        raise StorageError(f"cannot read the copy {path!r}: {e}") from e
    finally:
        os.close(fd)
    return data_bytes


_fsync_dir = unsynced_marker.fsync_dir

LMDB_FILES = ("data.mdb", "lock.mdb")


def _ensure_unsynced_mark(path: str, boot_id: str) -> bool:
    """Before the first commit without fsync: discard a store left unsynced by another boot
    (a machine crash may have torn it), then mark it as unsynced during ``boot_id``. -> whether
    the store was discarded."""
    try:
        os.makedirs(path, exist_ok=True)
        marked = unsynced_marker.marked_boot_id(path)
        discard = marked is not None and marked != boot_id
        if discard:
            for name in LMDB_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, name))
        unsynced_marker.mark(path, boot_id)
    except OSError as e:
        raise StorageError(f"cannot prepare the store at {path!r}: {e}") from e
    return discard


def _storage_error(error: lmdb.Error) -> StorageError:
    if isinstance(error, lmdb.MapFullError):
        return StorageFullError(f"the LMDB map is full; the transaction is aborted ({error})")
    if isinstance(error, lmdb.ReadersFullError):
        return StorageBusyError(
            f"all {MAX_READERS} LMDB reader slots are taken by open transactions ({error})"
        )
    return StorageError(f"LMDB: {error}")


class LmdbStore:
    """A ``Store`` in one LMDB environment at ``path`` (a directory, created if missing).

    ``map_size_bytes`` is the size limit of the store (``StorageFullError`` beyond it); the file
    grows only as pages are used. ``sync=False`` skips the fsync on commit: faster, but a machine
    crash may lose the last commits (never corrupt the file); for tests and benchmarks.

    ``cache_of_log=True`` is for a store that a durable log rebuilds (a Raft shard's state: its
    snapshot file and journal are fsync'd and hold every committed entry, and apply is
    idempotent by index). Its commits are not fsync'd at all: no disk flush on the path from a
    commit to an answer, and none under the state's lock. A process crash loses nothing (the
    page cache outlives the process); a machine crash is detected at the next open by the boot
    id marker (``storage.unsynced_marker``) and the store is then discarded, opened empty, and
    rebuilt by the log (``discarded_after_machine_crash`` says so). Where the system has no
    boot id, the store falls back to one fsync per commit (data pages, not the meta page: a
    machine crash may then undo the last commit, never corrupt the file).
    """

    __slots__ = (
        "_closed",
        "_dbs",
        "_env",
        "_path",
        "_unsynced",
        "discarded_after_machine_crash",
        "on_commit",
    )

    def __init__(
        self,
        path: str,
        map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES,
        sync: bool = True,
        *,
        cache_of_log: bool = False,
        boot_id: Callable[[], str | None] = unsynced_marker.current_boot_id,
    ) -> None:
        self._path = path
        self._unsynced = False
        self.discarded_after_machine_crash = False
        metasync = sync
        if sync and cache_of_log:
            running_boot = boot_id()
            if running_boot is None:
                metasync = False
            else:
                self.discarded_after_machine_crash = _ensure_unsynced_mark(path, running_boot)
                sync = metasync = False
                self._unsynced = True
        try:
            env = lmdb.open(
                path,
                map_size=map_size_bytes,
                subdir=True,
                max_dbs=8,
                max_readers=MAX_READERS,
                sync=sync,
                metasync=metasync,
                readahead=False,
                lock=True,
            )
        except lmdb.Error as e:
            raise StorageError(f"cannot open the LMDB environment at {path!r}: {e}") from e
        try:
            if env.max_key_size() < KV_KEY_BYTES_MAX:
                raise StorageError(
                    f"this LMDB build allows keys of {env.max_key_size()} bytes, "
                    f"the key/value table needs {KV_KEY_BYTES_MAX}"
                )
            with env.begin(write=True) as txn:
                with txn.cursor() as cursor:
                    names = {key for key, _value in cursor}
                if FORMAT_1_DB in names:
                    raise OldFormatError(
                        f"the store at {path!r} was written by FluxMQ's record format 1 (one "
                        "row per message); this version stores record batches (format 2) and "
                        "does not read it. With the node stopped, run `fluxmq migrate "
                        "--data-dir <the node's data directory>` to rewrite it in place, or "
                        "start the node on an empty data directory"
                    )
                self._dbs = _Dbs(
                    log=env.open_db(b"batches", txn=txn),
                    meta=env.open_db(b"logmeta", txn=txn),
                    kv=env.open_db(b"kv", txn=txn),
                )
        except lmdb.Error as e:
            env.close()
            raise StorageError(f"cannot open the databases at {path!r}: {e}") from e
        except BaseException:
            env.close()
            raise
        self._env = env
        self._closed = False
        # Observer of write-commit durations in seconds (the fsync is most of it): metrics.
        self.on_commit: Callable[[float], None] | None = None

    def _live_env(self) -> Any:
        if self._closed:
            raise StorageError(f"the store at {self._path!r} is closed")
        return self._env

    @contextmanager
    def write(self) -> Iterator[LmdbWriteTxn]:
        env = self._live_env()
        try:
            raw = env.begin(write=True)
        except lmdb.Error as e:
            raise _storage_error(e) from e
        txn = LmdbWriteTxn(raw, self._dbs)
        try:
            yield txn
        except BaseException:
            txn._unusable = _ENDED
            raw.abort()
            raise
        txn._unusable = _ENDED
        failure = txn._failure
        if failure is not None:
            raw.abort()
            # The block swallowed the error, but the transaction is half done (or LMDB already
            # refused it): committing would break the all-or-nothing promise.
            if isinstance(failure, StorageFullError):
                raise StorageFullError("write transaction aborted: the store is full") from failure
            raise StorageError("write transaction aborted: an operation failed") from failure
        started = time.perf_counter()
        try:
            raw.commit()
        except lmdb.Error as e:
            raise _storage_error(e) from e
        if self.on_commit is not None:
            self.on_commit(time.perf_counter() - started)

    @contextmanager
    def read(self) -> Iterator[LmdbReadTxn]:
        env = self._live_env()
        try:
            raw = env.begin(write=False)
        except lmdb.Error as e:
            raise _storage_error(e) from e
        txn = LmdbReadTxn(raw, self._dbs)
        try:
            yield txn
        finally:
            txn._unusable = _ENDED
            raw.abort()
            txn._release()

    def stat(self) -> StoreStat:
        env = self._live_env()
        try:
            info = env.info()
            page_size = env.stat()["psize"]
        except lmdb.Error as e:
            raise _storage_error(e) from e
        try:
            file_bytes = os.stat(os.path.join(self._path, "data.mdb")).st_size
        except OSError as e:
            raise StorageError(f"cannot stat the LMDB data file: {e}") from e
        return StoreStat(file_bytes=file_bytes, used_bytes=(info["last_pgno"] + 1) * page_size)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                if self._unsynced:
                    self._env.sync(True)
                    unsynced_marker.clear(self._path)
            finally:
                self._env.close()

    def copy_to(self, path: str, txn: ReadTxn | None = None) -> None:
        env = self._live_env()
        if txn is not None and not (isinstance(txn, LmdbReadTxn) and txn._dbs is self._dbs):
            raise StorageError("copy_to takes a read transaction of this store")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StorageError(f"cannot create the copy {path!r}: {e}") from e
        try:
            try:
                # LMDB takes a transaction only for compacting copies; compacting also leaves
                # out free pages, so the copy is as small as the content.
                if txn is None:
                    with env.begin(write=False) as raw:
                        env.copyfd(fd, compact=True, txn=raw)
                else:
                    txn._check()
                    env.copyfd(fd, compact=True, txn=txn._txn)
                data_bytes = os.fstat(fd).st_size
                trailer = _COPY_MAGIC + _file_sha256(fd, data_bytes)
                if os.pwrite(fd, trailer, data_bytes) != len(trailer):
                    raise OSError("short write of the copy's trailer")
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(os.path.dirname(os.path.abspath(path)))
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(path)
            if isinstance(e, lmdb.Error):
                raise _storage_error(e) from e
            if isinstance(e, OSError):
                raise StorageError(f"cannot write the copy {path!r}: {e}") from e
            raise

    def replace_from(self, path: str) -> None:
        env = self._live_env()
        data_bytes = check_copy_file(path)
        try:
            source = lmdb.open(
                path, subdir=False, readonly=True, lock=False, max_dbs=8, readahead=False
            )
        except lmdb.Error as e:
            raise StorageError(f"{path!r} is not a copy of an LMDB store: {e}") from e
        try:
            # Belt and braces after the sha256: pages past the end of the file would be a crash.
            pages_bytes = (source.info()["last_pgno"] + 1) * source.stat()["psize"]
            if pages_bytes > data_bytes:
                raise StorageError(
                    f"{path!r} is not a usable copy: its pages need {pages_bytes} bytes, "
                    f"it holds {data_bytes}"
                )
            with source.begin(write=False) as src:
                src_dbs = _open_copy_dbs(source, src, path)
                try:
                    dst = env.begin(write=True)
                except lmdb.Error as e:
                    raise _storage_error(e) from e
                try:
                    _replace(dst, self._dbs, src, src_dbs, path)
                except BaseException:
                    dst.abort()
                    raise
                try:
                    dst.commit()
                except lmdb.Error as e:
                    raise _storage_error(e) from e
        except lmdb.Error as e:
            raise StorageError(f"cannot read the copy {path!r}: {e}") from e
        finally:
            source.close()

    def digest(self, exclude_kv_keys: Collection[bytes] = ()) -> str:
        env = self._live_env()
        exclude = frozenset(exclude_kv_keys)
        digest = ContentDigest()
        dbs = self._dbs
        try:
            with env.begin(write=False) as raw:
                for log_id, _key, _value, low, high, size in log_metas(raw, dbs.meta):
                    digest.log(log_id, low, high, size)
                    for header, _pos, stored in _log_batches(raw, dbs.log, log_id, low, high):
                        digest.batch(header.base_offset, stored)
                with raw.cursor(db=dbs.kv) as cursor:
                    for key, value in cursor:
                        if key not in exclude:
                            digest.kv(key, value)
        except lmdb.Error as e:
            raise _storage_error(e) from e
        return digest.hexdigest()


def _open_copy_dbs(source: Any, src: Any, path: str) -> _Dbs:
    """The databases of a copy, refusing a file that holds anything else."""
    with src.cursor() as cursor:
        names = [key for key, _value in cursor]
    if sorted(names) != sorted(DB_NAMES):
        raise StorageError(
            f"{path!r} is not a copy of a store: it holds the databases {names!r}, "
            f"a copy holds exactly {list(DB_NAMES)!r}"
        )
    try:
        log, meta, kv = (source.open_db(name, txn=src, create=False) for name in DB_NAMES)
    except lmdb.Error as e:
        raise StorageError(f"{path!r} is not a copy of a store: {e}") from e
    return _Dbs(log=log, meta=meta, kv=kv)


def _replace(dst: Any, dbs: _Dbs, src: Any, src_dbs: _Dbs, path: str) -> None:
    """Empty the live databases and fill them from the copy, checking the copy as it streams
    by (metadata and record checksums, no gaps, no orphans, key/value limits): a bad copy raises
    before the caller commits anything."""

    def refused(detail: object) -> _CopyRefusedError:
        return _CopyRefusedError(f"{path!r} is not a usable copy of a store: {detail}")

    for db in (dbs.log, dbs.meta, dbs.kv):
        dst.drop(db, delete=False)
    batches = 0
    try:
        with dst.cursor(db=dbs.meta) as out_meta, dst.cursor(db=dbs.log) as out_log:
            for log_id, key, value, low, high, size in log_metas(src, src_dbs.meta):
                # Logs come by log_id and batches by offset, so positions only ever grow and
                # every put may append at the end of the (emptied) database.
                out_meta.put(key, value, append=True)
                total = 0
                for _header, pos, stored in _log_batches(src, src_dbs.log, log_id, low, high):
                    total += len(stored)
                    out_log.put(pos, stored, append=True)
                    batches += 1
                if total != size:
                    raise refused(f"log {log_id} holds {total} bytes, its metadata says {size}")
        stored_batches = src.stat(src_dbs.log)["entries"]
        if stored_batches != batches:
            raise refused(f"{stored_batches - batches} batches lie outside every log's watermarks")
        with src.cursor(db=src_dbs.kv) as cursor, dst.cursor(db=dbs.kv) as out_kv:
            for key, value in cursor:
                if len(value) > KV_VALUE_BYTES_MAX:
                    raise refused(f"a key/value table value has {len(value)} bytes")
                out_kv.put(key, value, append=True)
    except _CopyRefusedError:
        raise
    except lmdb.MapFullError as e:
        raise _storage_error(e) from e
    except (StorageError, lmdb.Error) as e:
        # What else fails here is a check of the copy's content (metadata, checksums, gaps) or
        # LMDB reading it: the copy, not the live store, is at fault.
        raise refused(e) from e


class _CopyRefusedError(StorageError):
    """A file handed to ``replace_from`` that is not a sound copy."""


class _Dbs:
    """The handles of the named databases (opaque LMDB objects)."""

    __slots__ = ("kv", "log", "meta")

    def __init__(self, log: object, meta: object, kv: object) -> None:
        self.log = log
        self.meta = meta
        self.kv = kv


class _LmdbTxn:
    """What read and write transactions share: the key/value table and the usability check."""

    __slots__ = ("_dbs", "_may_change", "_txn", "_unusable")

    def __init__(self, txn: Any, dbs: _Dbs, may_change: bool) -> None:
        self._txn = txn
        self._dbs = dbs
        self._may_change = may_change
        # None while the transaction may be used, else why it may not.
        self._unusable: str | None = None

    def _check(self) -> None:
        if self._unusable is not None:
            raise StorageError(self._unusable)

    def get(self, key: bytes) -> bytes | None:
        self._check()
        check_kv_key(key)
        try:
            value: bytes | None = self._txn.get(key, db=self._dbs.kv)
        except lmdb.Error as e:
            raise _storage_error(e) from e
        return value

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        check_scan(prefix, start)
        return self._scan(prefix, start)

    def _scan(self, prefix: bytes, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        seek = prefix if start is None else start
        try:
            with self._txn.cursor(db=self._dbs.kv) as cursor:
                # LMDB refuses to seek to the empty key; the empty prefix means "from the first".
                found = cursor.set_range(seek) if seek else cursor.first()
                while found:
                    key: bytes = cursor.key()
                    if not key.startswith(prefix):
                        return
                    yield key, cursor.value()
                    self._check()
                    if self._may_change:
                        # The caller may have changed the table during the yield, after which
                        # LMDB leaves the cursor at a position that depends on what changed;
                        # seek again to what follows the key just returned.
                        found = cursor.set_range(key)
                        if found and cursor.key() == key:
                            found = cursor.next()
                    else:
                        found = cursor.next()
        except lmdb.Error as e:
            raise _storage_error(e) from e


class LmdbReadTxn(_LmdbTxn):
    """A read-only snapshot of the store (an LMDB read transaction)."""

    __slots__ = ("_logs",)

    def __init__(self, txn: Any, dbs: _Dbs) -> None:
        super().__init__(txn, dbs, may_change=False)
        self._logs: dict[int, LmdbPartitionLogReader] = {}

    def log(self, log_id: int) -> LmdbPartitionLogReader:
        self._check()
        log = self._logs.get(log_id)
        if log is None:
            check_log_id(log_id)
            log = self._logs[log_id] = LmdbPartitionLogReader(self, log_id)
        return log

    def _release(self) -> None:
        """Drops every reference to the ended LMDB transaction. py-lmdb keeps an aborted read
        transaction's reader slot until the Transaction object is freed, so a caller holding
        this object or one of its logs after the ``with`` (a stream between messages), or the
        cycle between them awaiting the garbage collector, would keep the slot taken and
        exhaust the table (MDB_READERS_FULL)."""
        for log in self._logs.values():
            log._txn = None
        self._logs.clear()
        self._txn = None


class LmdbWriteTxn(_LmdbTxn):
    """The write transaction. Any operation that fails after it changed something marks the
    transaction failed: every later operation raises, and it cannot commit."""

    __slots__ = ("_failure", "_logs")

    def __init__(self, txn: Any, dbs: _Dbs) -> None:
        super().__init__(txn, dbs, may_change=True)
        # One object per log and transaction, because each caches its watermarks.
        self._logs: dict[int, LmdbPartitionLog] = {}
        self._failure: StorageError | None = None

    def _fail(self, error: StorageError) -> StorageError:
        self._failure = error
        self._unusable = _FAILED
        return error

    def log(self, log_id: int) -> LmdbPartitionLog:
        self._check()
        log = self._logs.get(log_id)
        if log is None:
            check_log_id(log_id)
            log = self._logs[log_id] = LmdbPartitionLog(self, log_id)
        return log

    def put(self, key: bytes, value: bytes) -> None:
        self._check()
        check_kv_key(key)
        check_kv_value(value)
        try:
            self._txn.put(key, value, db=self._dbs.kv)
        except lmdb.Error as e:
            raise self._fail(_storage_error(e)) from e

    def delete(self, key: bytes) -> bool:
        self._check()
        check_kv_key(key)
        try:
            deleted: bool = self._txn.delete(key, db=self._dbs.kv)
        except lmdb.Error as e:
            raise self._fail(_storage_error(e)) from e
        return deleted


class LmdbPartitionLogReader:
    """One log seen through a transaction. Its watermarks are read once, when the transaction
    first asks for the log, and kept in step with the writes made through this object."""

    __slots__ = ("_db", "_high", "_log_id", "_low", "_meta_key", "_owner", "_size", "_txn")

    def __init__(self, owner: _LmdbTxn, log_id: int) -> None:
        self._owner = owner
        self._txn = owner._txn
        self._db = owner._dbs.log
        self._log_id = log_id
        self._meta_key = META_KEY.pack(log_id)
        try:
            raw = self._txn.get(self._meta_key, db=owner._dbs.meta)
        except lmdb.Error as e:
            raise _storage_error(e) from e
        if raw is None:
            self._low = self._high = self._size = 0
        else:
            self._low, self._high, self._size = self._unpack_meta(raw)

    def _unpack_meta(self, raw: bytes) -> tuple[int, int, int]:
        return unpack_meta(self._log_id, self._meta_key, raw)

    @property
    def log_id(self) -> int:
        return self._log_id

    def watermarks(self) -> Watermarks:
        self._owner._check()
        return Watermarks(self._low, self._high)

    def size_bytes(self) -> int:
        self._owner._check()
        return self._size

    def read(self, start_offset: int, max_records: int, max_bytes: int) -> list[Record]:
        self._owner._check()
        check_offset(start_offset, "start_offset")
        check_read_limits(max_records, max_bytes)
        offset = max(start_offset, self._low)
        end = min(self._high, offset + max_records)
        if offset >= end:
            return []
        log_id = self._log_id
        records: list[Record] = []
        total = 0
        try:
            with self._txn.cursor(db=self._db) as cursor:
                found = _seek_batch(cursor, log_id, offset)
                first = True
                while True:
                    base = _base_of(cursor.key(), log_id) if found else None
                    if base is None or base > offset:
                        raise CorruptRecordError(log_id, offset, "batch missing below high")
                    if base < offset and not first:
                        raise CorruptRecordError(log_id, base, "a batch overlaps the one before")
                    first = False
                    stored = cursor.value()
                    decoded = record_batch.decode(log_id, base, stored, offset, end - offset)
                    if not decoded:  # the batch ends below offset: the next one is missing
                        raise CorruptRecordError(log_id, offset, "batch missing below high")
                    for record in decoded:
                        if record.offset >= end:
                            return records
                        total += record.size_bytes
                        if total > max_bytes and records:
                            return records
                        records.append(record)
                    offset = decoded[-1].offset + 1
                    if offset >= end:
                        return records
                    found = cursor.next()
        except lmdb.Error as e:
            raise _storage_error(e) from e

    def read_batches(
        self, start_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        self._owner._check()
        check_offset(start_offset, "start_offset")
        check_read_limits(max_records, max_bytes)
        offset = max(start_offset, self._low)
        if offset >= self._high:
            return []
        out: list[StoredBatch] = []
        total = 0
        end = offset + max_records
        try:
            for header, _key, stored in _log_batches(
                self._txn, self._db, self._log_id, offset, self._high, check_crc=False
            ):
                total += len(stored)
                if total > max_bytes and out:
                    break
                out.append(StoredBatch(header.base_offset, header.count, stored))
                if header.last_offset + 1 >= end:
                    break
        except lmdb.Error as e:
            raise _storage_error(e) from e
        return out

    def batch_headers(self, start_offset: int, max_batches: int) -> list[BatchHeader]:
        self._owner._check()
        check_offset(start_offset, "start_offset")
        if max_batches < 1:
            raise ValueError(f"max_batches must be at least 1, got {max_batches}")
        offset = max(start_offset, self._low)
        if offset >= self._high:
            return []
        headers: list[BatchHeader] = []
        try:
            for header, _key, _value in _log_batches(
                self._txn, self._db, self._log_id, offset, self._high
            ):
                headers.append(header)
                if len(headers) == max_batches:
                    break
        except lmdb.Error as e:
            raise _storage_error(e) from e
        return headers

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """A binary search over batches: each step reads the header of the batch holding the
        middle offset and moves past the whole batch; only a batch whose timestamps straddle
        ``timestamp_ms`` is decoded."""
        self._owner._check()
        lo, hi = self._low, self._high
        while lo < hi:
            mid = (lo + hi) // 2
            header, stored = self._batch_holding(mid)
            if header.last_timestamp_ms < timestamp_ms:
                lo = header.last_offset + 1
            elif header.first_timestamp_ms >= timestamp_ms:
                hi = max(header.base_offset, lo)
            else:
                # Timestamps never decrease: every record before this batch is below too.
                start = max(header.base_offset, lo)
                for record in record_batch.decode(self._log_id, header.base_offset, stored, start):
                    if record.timestamp_ms >= timestamp_ms:
                        return record.offset
                return header.last_offset + 1
        return lo

    def _batch_holding(self, offset: int) -> tuple[BatchHeader, bytes]:
        log_id = self._log_id
        try:
            with self._txn.cursor(db=self._db) as cursor:
                found = _seek_batch(cursor, log_id, offset)
                base = _base_of(cursor.key(), log_id) if found else None
                if base is None or base > offset:
                    raise CorruptRecordError(log_id, offset, "batch missing below high")
                stored: bytes = cursor.value()
        except lmdb.Error as e:
            raise _storage_error(e) from e
        header = record_batch.read_header(log_id, base, stored)
        if header.last_offset < offset:
            raise CorruptRecordError(log_id, offset, "batch missing below high")
        return header, stored


class LmdbPartitionLog(LmdbPartitionLogReader):
    """One log inside the write transaction."""

    __slots__ = ("_writer",)

    def __init__(self, owner: LmdbWriteTxn, log_id: int) -> None:
        super().__init__(owner, log_id)
        self._writer = owner

    def append(self, records: Sequence[NewRecord]) -> int:
        self._owner._check()
        first = self._high
        count = len(records)
        if count == 0:
            return first
        check_append_room(first, count)
        # Encoded before the first write, so a record over a limit (ValueError) leaves the
        # transaction untouched and usable.
        return self._write(first, count, record_batch.encode(self._log_id, first, records))

    def append_batch(
        self,
        timestamp_ms: int,
        count: int,
        records_section: bytes,
        producer_id: int = 0,
        producer_epoch: int = 0,
        first_sequence: int = 0,
    ) -> int:
        self._owner._check()
        first = self._high
        check_append_room(first, count)
        stored = record_batch.seal(
            self._log_id, first, timestamp_ms, count, records_section,
            producer_id, producer_epoch, first_sequence,
        )  # fmt: skip
        return self._write(first, count, stored)

    def _write(self, first: int, count: int, stored: bytes) -> int:
        log_id = self._log_id
        pos = position(log_id, first)
        try:
            with self._txn.cursor(db=self._db) as cursor:
                # MDB_APPEND skips the tree search, but LMDB accepts it only for a key above the
                # last key of the whole database: when no higher log_id has batches.
                append = not cursor.last() or cursor.key() < pos
                added = cursor.put(pos, stored, overwrite=False, append=append)
        except lmdb.Error as e:
            raise self._writer._fail(_storage_error(e)) from e
        if not added:
            raise self._writer._fail(
                StorageError(
                    f"log {log_id}: offset {first} already holds a batch; the log's metadata "
                    "does not match its batches"
                )
            )
        self._high = first + count
        self._size += len(stored)
        self._put_meta()
        return first

    def truncate_before(self, offset: int, max_records: int | None = None) -> TruncateResult:
        self._owner._check()
        check_offset(offset)
        check_chunk(max_records)
        if offset > self._high:
            raise OffsetOutOfRangeError(
                f"cannot truncate log {self._log_id} before {offset}: high is {self._high}"
            )
        low = self._low
        stop = offset if max_records is None else min(offset, low + max_records)
        if stop <= low:
            return TruncateResult(removed_records=0, removed_bytes=0, low=low)
        removed_bytes = self._delete_from_low(stop)
        self._put_meta()
        return TruncateResult(removed_records=stop - low, removed_bytes=removed_bytes, low=stop)

    def drop(self, max_records: int | None = None) -> bool:
        self._owner._check()
        check_chunk(max_records)
        low, high = self._low, self._high
        if low < high:
            stop = high if max_records is None else min(high, low + max_records)
            self._delete_from_low(stop)
            if stop < high:
                self._put_meta()
                return False
        try:
            self._txn.delete(self._meta_key, db=self._writer._dbs.meta)
        except lmdb.Error as e:
            raise self._writer._fail(_storage_error(e)) from e
        self._low = self._high = 0
        return True

    def _delete_from_low(self, stop: int) -> int:
        """Move low to ``stop`` and delete the batches that end below it; return the bytes
        removed. A batch holding ``stop`` stays (its records below low are not read again)."""
        log_id = self._log_id
        offset = self._low
        removed = 0
        try:
            with self._txn.cursor(db=self._db) as cursor:
                found = _seek_batch(cursor, log_id, offset)
                while True:
                    # Deleting moves the cursor to the next key, so a gap shows up as a wrong
                    # base (or no key at all) here.
                    base = _base_of(cursor.key(), log_id) if found else None
                    if base is None or base > offset:
                        raise self._writer._fail(
                            CorruptRecordError(log_id, offset, "batch missing below high")
                        )
                    stored = cursor.value()
                    header = record_batch.read_header(log_id, base, stored, check_crc=False)
                    if header.last_offset >= stop:
                        break
                    removed += len(stored)
                    cursor.delete()
                    offset = header.last_offset + 1
                    if offset >= self._high:
                        break
                    found = cursor.key() != b""
        except lmdb.Error as e:
            raise self._writer._fail(_storage_error(e)) from e
        except CorruptBatchError as e:
            raise self._writer._fail(e) from e
        size = self._size - removed
        if size < 0 or (size == 0) != (offset >= self._high):
            raise self._writer._fail(
                StorageError(
                    f"log {log_id}: removing {removed} bytes below {stop} leaves size_bytes "
                    f"{size} for [{stop}, {self._high}); the metadata does not match the batches"
                )
            )
        self._low = stop
        self._size = size
        return removed

    def _put_meta(self) -> None:
        fields = META_FIELDS.pack(self._low, self._high, self._size)
        value = fields + META_CRC.pack(crc32c(fields, crc32c(self._meta_key)))
        try:
            self._txn.put(self._meta_key, value, db=self._writer._dbs.meta)
        except lmdb.Error as e:
            raise self._writer._fail(_storage_error(e)) from e


if TYPE_CHECKING:
    # Nothing else names the Protocols next to these classes; this makes mypy prove they conform.
    def _conforms(
        store: LmdbStore,
        read_txn: LmdbReadTxn,
        write_txn: LmdbWriteTxn,
        reader: LmdbPartitionLogReader,
        log: LmdbPartitionLog,
    ) -> tuple[Store, ReadTxn, WriteTxn, PartitionLogReader, PartitionLog]:
        return store, read_txn, write_txn, reader, log
