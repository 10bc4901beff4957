"""The in-memory twin of ``LmdbStore``, for tests and simulations.

It keeps every batch sealed exactly as LMDB would (``record_batch``, format 2, the same
position-salted crc): per log a list of (base offset, sealed batch) in offset order, found by
bisection, so sizes, limits, errors and decoding are the same code paths. A write transaction
changes the live state directly and keeps an undo log; an exception inside ``with
store.write()`` replays it.

It is meant for one thread. It keeps no snapshots, so a read transaction is only valid while the
store does not change under it: a read through a read transaction that overlaps a write which
changed something (or a ``replace_from``) raises ``StorageError`` instead of silently seeing
other data than LMDB would.

A copy (``copy_to``) is a file of its own format, all integers big-endian::

    magic           b"FLUXMQ-MEMORY-STORE-2\n"
    per log, by ascending log_id:
        b"L", log_id u64, low u64, high u64, size_bytes u64
        per stored batch, by ascending base offset: base_offset u64, length u32, the batch
    per key/value pair, by ascending key:
        b"K", key length u16, value length u32, key, value
    b"E", sha256 of every byte before it (this b"E" included)

A log's batches need no count: they tile [first base, high), so the reader knows a log ended
when the batches reach ``high``. ``replace_from`` checks every batch's crc, that they tile
without gaps or overlaps, that the first holds ``low`` and that their sizes add up.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import struct
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

from storage import record_batch
from storage.api import (
    ContentDigest,
    CorruptRecordError,
    NewRecord,
    OffsetOutOfRangeError,
    Record,
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
)
from storage.record_batch import BatchHeader, CorruptBatchError

if TYPE_CHECKING:
    from storage.api import PartitionLog, PartitionLogReader, ReadTxn, Store, WriteTxn

_COPY_MAGIC = b"FLUXMQ-MEMORY-STORE-2\n"
_COPY_LOG = struct.Struct(">QQQQ")
_COPY_BATCH = struct.Struct(">QI")
_COPY_KV = struct.Struct(">HI")
_COPY_END_BYTES = hashlib.sha256().digest_size
_COPY_BUFFER_BYTES = 1024 * 1024

_ENDED = "the transaction has ended"
_FAILED = "an earlier operation of this write transaction failed; it can only be aborted"
_STALE = (
    "MemoryStore keeps no snapshots and a write changed the store during this read "
    "transaction; LmdbStore would show the older state here"
)


class _LogState:
    """The stored part of one log: its sealed batches by base offset, and its watermarks.

    ``bases`` and ``batches`` run in step, by ascending base offset; the batches tile
    [``bases[0]``, ``high``) and the first one holds ``low`` (none when ``low == high``).
    Appends add at the end and truncations remove from the front, so two lists suffice.
    """

    __slots__ = ("bases", "batches", "high", "low", "size")

    def __init__(self) -> None:
        self.low = 0
        self.high = 0
        self.size = 0
        self.bases: list[int] = []
        self.batches: list[bytes] = []

    def index_of(self, offset: int) -> int:
        """The index of the batch holding ``offset`` (which must lie in [low, high))."""
        return bisect.bisect_right(self.bases, offset) - 1

    def end_of(self, index: int) -> int:
        """One past the last offset of batch ``index``: where the next batch begins."""
        bases = self.bases
        return bases[index + 1] if index + 1 < len(bases) else self.high


class MemoryStore:
    """A ``Store`` in memory. ``max_bytes`` bounds the stored batches plus key/value bytes
    (``StorageFullError`` beyond it), to exercise the store-full path without a disk."""

    __slots__ = (
        "_closed",
        "_kv",
        "_kv_keys",
        "_logs",
        "_max_bytes",
        "_used",
        "_version",
        "_writer",
    )

    def __init__(self, max_bytes: int | None = None) -> None:
        self._logs: dict[int, _LogState] = {}
        self._kv: dict[bytes, bytes] = {}
        self._kv_keys: list[bytes] = []  # the keys of _kv, sorted, for scans
        self._used = 0
        self._max_bytes = max_bytes
        # Bumped by every change a write transaction makes; a read transaction that sees it move
        # has lost its snapshot.
        self._version = 0
        self._writer: MemoryWriteTxn | None = None
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the memory store is closed")

    @contextmanager
    def write(self) -> Iterator[MemoryWriteTxn]:
        self._check_open()
        if self._writer is not None:
            # In LMDB a second writer in the writer's thread would deadlock, which LmdbStore
            # refuses; the twin has only that one thread, so it refuses every second writer.
            raise StorageError("a write transaction is already open")
        txn = self._writer = MemoryWriteTxn(self)
        try:
            yield txn
        except BaseException:
            txn._rollback()
            raise
        finally:
            txn._unusable = _ENDED
            self._writer = None
        failure = txn._failure
        if failure is not None:
            txn._rollback()
            if isinstance(failure, StorageFullError):
                raise StorageFullError("write transaction aborted: the store is full") from failure
            raise StorageError("write transaction aborted: an operation failed") from failure

    @contextmanager
    def read(self) -> Iterator[MemoryReadTxn]:
        self._check_open()
        txn = MemoryReadTxn(self)
        try:
            yield txn
        finally:
            txn._unusable = _ENDED

    def stat(self) -> StoreStat:
        self._check_open()
        return StoreStat(file_bytes=0, used_bytes=self._used)

    def close(self) -> None:
        self._closed = True

    def copy_to(self, path: str, txn: ReadTxn | None = None) -> None:
        self._check_open()
        if txn is not None:
            if not (isinstance(txn, MemoryReadTxn) and txn._store is self):
                raise StorageError("copy_to takes a read transaction of this store")
            txn._check()
        elif self._writer is not None and self._writer._undo:
            # The live state holds uncommitted changes, which a copy must not show.
            raise StorageError("cannot copy the memory store while a write changes it")
        try:
            file = open(path, "xb", buffering=_COPY_BUFFER_BYTES)  # noqa: SIM115
        except OSError as e:
            raise StorageError(f"cannot create the copy {path!r}: {e}") from e
        version = self._version
        try:
            with file:
                self._write_copy(_HashingWriter(file))
                if self._version != version:
                    # Only another thread could have written, which this store does not support;
                    # the copy may mix two states, so it is thrown away.
                    raise StorageError("the memory store changed while it was being copied")
                file.flush()
                os.fsync(file.fileno())
            _fsync_dir(os.path.dirname(os.path.abspath(path)))
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(path)
            if isinstance(e, OSError):
                raise StorageError(f"cannot write the copy {path!r}: {e}") from e
            raise

    def _write_copy(self, out: _HashingWriter) -> None:
        out.write(_COPY_MAGIC)
        for log_id in sorted(self._logs):
            state = self._logs[log_id]
            out.write(b"L" + _COPY_LOG.pack(log_id, state.low, state.high, state.size))
            for base, batch in zip(state.bases, state.batches, strict=True):
                out.write(_COPY_BATCH.pack(base, len(batch)))
                out.write(batch)
        for key in self._kv_keys:
            value = self._kv[key]
            out.write(b"K" + _COPY_KV.pack(len(key), len(value)))
            out.write(key)
            out.write(value)
        out.end()

    def replace_from(self, path: str) -> None:
        self._check_open()
        if self._writer is not None:
            raise StorageError("cannot replace the memory store while a write transaction is open")
        try:
            with open(path, "rb", buffering=_COPY_BUFFER_BYTES) as file:
                source = _HashingReader(file, os.fstat(file.fileno()).st_size, path)
                logs, kv, used = _read_copy(source)
        except OSError as e:
            raise StorageError(f"cannot read the copy {path!r}: {e}") from e
        if self._max_bytes is not None and used > self._max_bytes:
            raise StorageFullError(
                f"the copy {path!r} holds {used} bytes, the memory store takes {self._max_bytes}"
            )
        # Everything was read and checked before this point: the swap itself cannot fail.
        self._logs = logs
        self._kv = kv
        self._kv_keys = list(kv)
        self._used = used
        self._version += 1

    def digest(self, exclude_kv_keys: Collection[bytes] = ()) -> str:
        self._check_open()
        exclude = frozenset(exclude_kv_keys)
        digest = ContentDigest()
        for log_id in sorted(self._logs):
            state = self._logs[log_id]
            digest.log(log_id, state.low, state.high, state.size)
            for base, batch in zip(state.bases, state.batches, strict=True):
                # Checked as LmdbStore checks it: a damaged batch is refused, never digested.
                record_batch.read_header(log_id, base, batch)
                digest.batch(base, batch)
        for key in self._kv_keys:
            if key not in exclude:
                digest.kv(key, self._kv[key])
        return digest.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingWriter:
    __slots__ = ("_file", "_hash")

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._hash = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self._hash.update(data)
        self._file.write(data)

    def end(self) -> None:
        self.write(b"E")
        self._file.write(self._hash.digest())


class _HashingReader:
    """Reads a copy, hashing what it read; refuses to read past the end of the file, so a
    damaged length field cannot make it allocate more than the file holds."""

    __slots__ = ("_file", "_hash", "_left", "path")

    def __init__(self, file: IO[bytes], size_bytes: int, path: str) -> None:
        self._file = file
        self._hash = hashlib.sha256()
        self._left = size_bytes
        self.path = path

    def refused(self, detail: str) -> StorageError:
        return StorageError(f"{self.path!r} is not a usable copy of a memory store: {detail}")

    def read(self, size: int) -> bytes:
        if size > self._left:
            raise self.refused("it ends in the middle of an item")
        data = self._file.read(size)
        if len(data) != size:
            raise self.refused("it ended while being read")
        self._left -= size
        self._hash.update(data)
        return data

    def check_end(self) -> None:
        expected = self._hash.digest()
        if self.read(_COPY_END_BYTES) != expected:
            raise self.refused("its sha256 does not match its content")
        if self._left:
            raise self.refused(f"{self._left} bytes follow its end")


def _read_copy(source: _HashingReader) -> tuple[dict[int, _LogState], dict[bytes, bytes], int]:
    """The logs, key/value table (in key order) and used bytes of a copy, every part checked."""
    if source.read(len(_COPY_MAGIC)) != _COPY_MAGIC:
        raise source.refused("it does not start with the format's magic bytes")
    logs: dict[int, _LogState] = {}
    kv: dict[bytes, bytes] = {}
    used = 0
    last_log_id = -1
    last_key: bytes | None = None
    while True:
        tag = source.read(1)
        if tag == b"E":
            source.check_end()
            return logs, kv, used
        if tag == b"L" and last_key is None:
            log_id, low, high, size = _COPY_LOG.unpack(source.read(_COPY_LOG.size))
            if log_id <= last_log_id or low > high or (size == 0) != (low == high):
                raise source.refused(
                    f"log {log_id} after log {last_log_id}: low={low} high={high} size={size}"
                )
            last_log_id = log_id
            logs[log_id] = _read_log(source, log_id, low, high, size)
            used += size
        elif tag == b"K":
            key_len, value_len = _COPY_KV.unpack(source.read(_COPY_KV.size))
            if not 0 < key_len <= KV_KEY_BYTES_MAX or value_len > KV_VALUE_BYTES_MAX:
                raise source.refused(f"a key of {key_len} bytes with a value of {value_len}")
            key = source.read(key_len)
            if last_key is not None and key <= last_key:
                raise source.refused("its key/value pairs are not in ascending key order")
            kv[key] = source.read(value_len)
            last_key = key
            used += key_len + value_len
        else:
            raise source.refused(f"unexpected item tag {tag!r}")


def _read_log(source: _HashingReader, log_id: int, low: int, high: int, size: int) -> _LogState:
    """The batches of one log in a copy: each checked (crc at its position), tiling
    [first base, high) with the first one holding ``low``, their sizes adding up to ``size``."""
    state = _LogState()
    state.low, state.high, state.size = low, high, size
    total = 0
    expected: int | None = None  # where the next batch must begin; None before the first
    end = low
    while end < high:
        base, length = _COPY_BATCH.unpack(source.read(_COPY_BATCH.size))
        if expected is None and base > low:
            raise source.refused(f"log {log_id}: its first batch at {base} is above low {low}")
        if expected is not None and base != expected:
            raise source.refused(
                f"log {log_id}: a batch at {base} where the one before ends at {expected}"
            )
        batch = source.read(length)
        try:
            header = record_batch.read_header(log_id, base, batch)
        except CorruptRecordError as e:
            raise source.refused(str(e)) from e
        end = header.last_offset + 1
        if end <= low or end > high:
            raise source.refused(
                f"log {log_id}: the batch [{base}, {header.last_offset}] lies outside "
                f"[low {low}, high {high})"
            )
        state.bases.append(base)
        state.batches.append(batch)
        total += length
        expected = end
    if total != size:
        raise source.refused(f"log {log_id} holds {total} bytes, its metadata says {size}")
    return state


class _MemoryTxn:
    __slots__ = ("_store", "_unusable")

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._unusable: str | None = None

    def _check(self) -> None:
        if self._unusable is not None:
            raise StorageError(self._unusable)

    def get(self, key: bytes) -> bytes | None:
        self._check()
        check_kv_key(key)
        return self._store._kv.get(key)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        check_scan(prefix, start)
        return self._scan(prefix, start)

    def _scan(self, prefix: bytes, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        store = self._store
        keys = store._kv_keys
        # Seek again after every yield, like an LMDB cursor moving on from its key: the caller
        # may change the table between steps, and the next key is whatever follows by then.
        index = bisect.bisect_left(keys, prefix if start is None else start)
        while index < len(keys) and keys[index].startswith(prefix):
            key = keys[index]
            yield key, store._kv[key]
            self._check()
            index = bisect.bisect_right(keys, key)


class MemoryReadTxn(_MemoryTxn):
    __slots__ = ("_logs", "_version")

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self._logs: dict[int, MemoryPartitionLogReader] = {}
        writer = store._writer
        # A read that begins while a write has uncommitted changes would see them; mark the
        # snapshot as already gone.
        dirty = writer is not None and bool(writer._undo)
        self._version = -1 if dirty else store._version

    def _check(self) -> None:
        super()._check()
        if self._version != self._store._version:
            raise StorageError(_STALE)

    def log(self, log_id: int) -> MemoryPartitionLogReader:
        self._check()
        log = self._logs.get(log_id)
        if log is None:
            check_log_id(log_id)
            log = self._logs[log_id] = MemoryPartitionLogReader(self, log_id)
        return log


class MemoryWriteTxn(_MemoryTxn):
    __slots__ = ("_failure", "_logs", "_undo")

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self._logs: dict[int, MemoryPartitionLog] = {}
        self._undo: list[Callable[[], None]] = []
        self._failure: StorageError | None = None

    def _fail(self, error: StorageError) -> StorageError:
        self._failure = error
        self._unusable = _FAILED
        return error

    def _changed(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)
        self._store._version += 1

    def _reserve(self, more_bytes: int) -> None:
        store = self._store
        if store._max_bytes is not None and store._used + more_bytes > store._max_bytes:
            raise self._fail(
                StorageFullError(
                    f"the memory store is full: {store._used} of {store._max_bytes} bytes used, "
                    f"{more_bytes} more requested; the transaction is aborted"
                )
            )

    def _rollback(self) -> None:
        undo = self._undo
        while undo:
            undo.pop()()

    def log(self, log_id: int) -> MemoryPartitionLog:
        self._check()
        log = self._logs.get(log_id)
        if log is None:
            check_log_id(log_id)
            log = self._logs[log_id] = MemoryPartitionLog(self, log_id)
        return log

    def put(self, key: bytes, value: bytes) -> None:
        self._check()
        check_kv_key(key)
        check_kv_value(value)
        store = self._store
        old = store._kv.get(key)
        delta = len(key) + len(value) if old is None else len(value) - len(old)
        if delta > 0:
            self._reserve(delta)
        if old is None:
            bisect.insort(store._kv_keys, key)
        store._kv[key] = value
        store._used += delta

        def undo() -> None:
            if old is None:
                del store._kv[key]
                del store._kv_keys[bisect.bisect_left(store._kv_keys, key)]
            else:
                store._kv[key] = old
            store._used -= delta

        self._changed(undo)

    def delete(self, key: bytes) -> bool:
        self._check()
        check_kv_key(key)
        store = self._store
        old = store._kv.pop(key, None)
        if old is None:
            return False
        del store._kv_keys[bisect.bisect_left(store._kv_keys, key)]
        freed = len(key) + len(old)
        store._used -= freed

        def undo() -> None:
            bisect.insort(store._kv_keys, key)
            store._kv[key] = old
            store._used += freed

        self._changed(undo)
        return True


class MemoryPartitionLogReader:
    __slots__ = ("_log_id", "_owner", "_store")

    def __init__(self, owner: _MemoryTxn, log_id: int) -> None:
        self._owner = owner
        self._store = owner._store
        self._log_id = log_id

    def _state(self) -> _LogState | None:
        self._owner._check()
        return self._store._logs.get(self._log_id)

    @property
    def log_id(self) -> int:
        return self._log_id

    def watermarks(self) -> Watermarks:
        state = self._state()
        return Watermarks(0, 0) if state is None else Watermarks(state.low, state.high)

    def size_bytes(self) -> int:
        state = self._state()
        return 0 if state is None else state.size

    def read(self, start_offset: int, max_records: int, max_bytes: int) -> list[Record]:
        state = self._state()
        check_offset(start_offset, "start_offset")
        check_read_limits(max_records, max_bytes)
        if state is None:
            return []
        offset = max(start_offset, state.low)
        end = min(state.high, offset + max_records)
        if offset >= end:
            return []
        log_id = self._log_id
        bases, batches = state.bases, state.batches
        records: list[Record] = []
        total = 0
        index = state.index_of(offset)
        while offset < end:
            # decode checks the whole batch, also the records it leaves out below offset.
            for record in record_batch.decode(log_id, bases[index], batches[index], offset):
                if record.offset >= end:
                    return records
                total += record.size_bytes
                if total > max_bytes and records:
                    return records
                records.append(record)
            offset = state.end_of(index)
            index += 1
        return records

    def read_batches(
        self, start_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        state = self._state()
        check_offset(start_offset, "start_offset")
        check_read_limits(max_records, max_bytes)
        if state is None:
            return []
        offset = max(start_offset, state.low)
        if offset >= state.high:
            return []
        log_id = self._log_id
        end = offset + max_records
        out: list[StoredBatch] = []
        total = 0
        for index in range(state.index_of(offset), len(state.bases)):
            base, stored = state.bases[index], state.batches[index]
            # The crc is the reader's to check (as LmdbStore leaves it); the header must still
            # fit where the batch lies, or the count handed on would be a lie.
            header = record_batch.read_header(log_id, base, stored, check_crc=False)
            if header.last_offset + 1 != state.end_of(index):
                raise CorruptBatchError(
                    log_id,
                    base,
                    header.last_offset,
                    f"batch [{base}, {header.last_offset}] does not end where the next one "
                    f"begins ({state.end_of(index)})",
                )
            total += len(stored)
            if total > max_bytes and out:
                break
            out.append(StoredBatch(base, header.count, stored))
            if header.last_offset + 1 >= end:
                break
        return out

    def batch_headers(self, start_offset: int, max_batches: int) -> list[BatchHeader]:
        state = self._state()
        check_offset(start_offset, "start_offset")
        if max_batches < 1:
            raise ValueError(f"max_batches must be at least 1, got {max_batches}")
        if state is None:
            return []
        offset = max(start_offset, state.low)
        if offset >= state.high:
            return []
        log_id = self._log_id
        first = state.index_of(offset)
        return [
            record_batch.read_header(log_id, base, batch)
            for base, batch in zip(
                state.bases[first : first + max_batches],
                state.batches[first : first + max_batches],
                strict=True,
            )
        ]

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        state = self._state()
        if state is None or state.low >= state.high:
            return 0 if state is None else state.high
        log_id = self._log_id
        bases, batches = state.bases, state.batches
        # The first batch whose last timestamp reaches timestamp_ms holds the answer; headers
        # say that without decoding. Timestamps never decrease, so a binary search finds it.
        lo, hi = state.index_of(state.low), len(bases)
        while lo < hi:
            mid = (lo + hi) // 2
            if record_batch.read_header(log_id, bases[mid], batches[mid]).last_timestamp_ms < (
                timestamp_ms
            ):
                lo = mid + 1
            else:
                hi = mid
        if lo == len(bases):
            return state.high
        header = record_batch.read_header(log_id, bases[lo], batches[lo])
        start = max(header.base_offset, state.low)
        if header.first_timestamp_ms >= timestamp_ms:
            return start
        # The batch straddles timestamp_ms: only its records say where.
        for record in record_batch.decode(log_id, bases[lo], batches[lo], start):
            if record.timestamp_ms >= timestamp_ms:
                return record.offset
        raise CorruptRecordError(
            log_id, header.last_offset, "no record reaches the batch's last timestamp"
        )


class MemoryPartitionLog(MemoryPartitionLogReader):
    __slots__ = ("_writer",)

    def __init__(self, owner: MemoryWriteTxn, log_id: int) -> None:
        super().__init__(owner, log_id)
        self._writer = owner

    def append(self, records: Sequence[NewRecord]) -> int:
        state = self._state()
        first = 0 if state is None else state.high
        count = len(records)
        if count == 0:
            return first
        check_append_room(first, count)
        # Encoded before anything changes, so a refused record leaves the transaction usable.
        return self._store_batch(
            state, first, count, record_batch.encode(self._log_id, first, records)
        )

    def append_batch(
        self,
        timestamp_ms: int,
        count: int,
        records_section: bytes,
        producer_id: int = 0,
        producer_epoch: int = 0,
        first_sequence: int = 0,
    ) -> int:
        state = self._state()
        first = 0 if state is None else state.high
        check_append_room(first, count)
        sealed = record_batch.seal(
            self._log_id, first, timestamp_ms, count, records_section,
            producer_id, producer_epoch, first_sequence,
        )  # fmt: skip
        return self._store_batch(state, first, count, sealed)

    def _store_batch(self, state: _LogState | None, first: int, count: int, sealed: bytes) -> int:
        log_id = self._log_id
        added = len(sealed)
        writer = self._writer
        writer._reserve(added)
        store = self._store
        created = state is None
        if state is None:
            target = store._logs[log_id] = _LogState()
        else:
            target = state
        target.bases.append(first)
        target.batches.append(sealed)
        target.high += count
        target.size += added
        store._used += added

        def undo() -> None:
            target.bases.pop()
            target.batches.pop()
            target.high -= count
            target.size -= added
            store._used -= added
            if created:
                del store._logs[log_id]

        writer._changed(undo)
        return first

    def truncate_before(self, offset: int, max_records: int | None = None) -> TruncateResult:
        state = self._state()
        check_offset(offset)
        check_chunk(max_records)
        low = 0 if state is None else state.low
        high = 0 if state is None else state.high
        if offset > high:
            raise OffsetOutOfRangeError(
                f"cannot truncate log {self._log_id} before {offset}: high is {high}"
            )
        stop = offset if max_records is None else min(offset, low + max_records)
        if state is None or stop <= low:
            return TruncateResult(removed_records=0, removed_bytes=0, low=low)
        removed_bytes = self._delete_from_low(state, stop)
        return TruncateResult(removed_records=stop - low, removed_bytes=removed_bytes, low=stop)

    def drop(self, max_records: int | None = None) -> bool:
        state = self._state()
        check_chunk(max_records)
        if state is None:
            return True
        if state.low < state.high:
            stop = state.high if max_records is None else min(state.high, state.low + max_records)
            self._delete_from_low(state, stop)
            if stop < state.high:
                return False
        store = self._store
        log_id = self._log_id
        del store._logs[log_id]

        def undo() -> None:
            store._logs[log_id] = state

        self._writer._changed(undo)
        return True

    def _delete_from_low(self, state: _LogState, stop: int) -> int:
        """Move low to ``stop`` and delete the batches that end below it; return the bytes
        removed. A batch holding ``stop`` stays (its records below low are not read again)."""
        low = state.low
        # Every batch before the one holding stop ends at or below it; at high, all of them.
        kept_from = len(state.bases) if stop >= state.high else state.index_of(stop)
        removed_bases = state.bases[:kept_from]
        removed_batches = state.batches[:kept_from]
        del state.bases[:kept_from]
        del state.batches[:kept_from]
        removed_bytes = sum(map(len, removed_batches))
        state.low = stop
        state.size -= removed_bytes
        store = self._store
        store._used -= removed_bytes

        def undo() -> None:
            state.bases[:0] = removed_bases
            state.batches[:0] = removed_batches
            state.low = low
            state.size += removed_bytes
            store._used += removed_bytes

        self._writer._changed(undo)
        return removed_bytes


if TYPE_CHECKING:
    # Nothing else names the Protocols next to these classes; this makes mypy prove they conform.
    def _conforms(
        store: MemoryStore,
        read_txn: MemoryReadTxn,
        write_txn: MemoryWriteTxn,
        reader: MemoryPartitionLogReader,
        log: MemoryPartitionLog,
    ) -> tuple[Store, ReadTxn, WriteTxn, PartitionLogReader, PartitionLog]:
        return store, read_txn, write_txn, reader, log
