"""The storage contract: partition logs and a small key/value table, inside one transaction.

A node keeps everything in one store (one LMDB environment per data dir). A write transaction
groups any number of partition appends/truncations and key/value changes; they become durable
together (one fsync) when the transaction commits, or not at all.

Nothing here knows about queues: a partition log is identified by an opaque ``log_id`` (u64) and
the key/value table holds opaque bytes. The layers above choose the meaning.

Offsets of a log are contiguous u64 from 0. ``low`` is the first offset still readable (it moves
up with ``truncate_before``), ``high`` the next offset to be written. An empty, never-written log
has ``low == high == 0``.

A log stores **record batches** (``storage.record_batch``, format 2): each append is one batch,
one stored row with one checksum, whatever the number of records in it. Offsets stay per record.
A truncation point may fall inside a batch: the records below ``low`` are no longer readable,
and the batch is deleted once all of its records are below ``low``. ``size_bytes`` counts the
stored batches (what the disk holds), so retention by bytes frees whole batches.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# The record types, their limits and the base errors live in storage.records (below the codecs,
# which must not import this module); they are part of the API all the same.
from storage.records import IDEMPOTENCY_KEY_BYTES_MAX as IDEMPOTENCY_KEY_BYTES_MAX
from storage.records import LOG_ID_MAX as LOG_ID_MAX
from storage.records import RECORD_HEADERS_MAX as RECORD_HEADERS_MAX
from storage.records import RECORD_KEY_BYTES_MAX as RECORD_KEY_BYTES_MAX
from storage.records import RECORD_VALUE_BYTES_MAX as RECORD_VALUE_BYTES_MAX
from storage.records import CorruptRecordError as CorruptRecordError
from storage.records import NewRecord as NewRecord
from storage.records import Record as Record
from storage.records import StorageError as StorageError

if TYPE_CHECKING:
    from storage.record_batch import BatchHeader


class OffsetOutOfRangeError(StorageError):
    """An offset outside what the operation accepts (for example truncating above ``high``)."""


class StorageFullError(StorageError):
    """The store reached its configured size limit; nothing of the transaction was written."""


class OldFormatError(StorageError):
    """The data directory holds logs in an encoding this version does not read (record format
    1: one row per record). Nothing was changed; the message names the way forward."""


class StorageBusyError(StorageError):
    """Too many transactions are open at once (LMDB's reader table is full): nothing was read
    or written, and the same call may succeed once others end."""


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A record batch as stored (``record_batch`` format 2), not opened."""

    base_offset: int
    count: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Watermarks:
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class TruncateResult:
    removed_records: int
    removed_bytes: int
    low: int  # the low watermark after the truncation


class PartitionLogReader(Protocol):
    """Read side of one partition log, seen through a transaction."""

    @property
    def log_id(self) -> int: ...

    def watermarks(self) -> Watermarks: ...

    def size_bytes(self) -> int:
        """Bytes of the stored batches (each whole, header included; 0 for an empty log)."""
        ...

    def read(self, start_offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """Records from ``max(start_offset, low)`` upward, in offset order.

        Stops at ``high``, after ``max_records`` records, or before the record that would take the
        total of ``size_bytes`` over ``max_bytes``, but always returns at least one record when one
        exists at or above ``start_offset`` (so a single large record can still be read).
        Raises ``CorruptRecordError`` for a record that fails its checksum.
        """
        ...

    def read_batches(
        self, start_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        """The stored batches from the one holding ``max(start_offset, low)`` upward, as they
        are (their checksums are the reader's to check), until they hold ``max_records``
        records from that offset on or before the batch that would take their total length over
        ``max_bytes``; at least one batch when one exists. The first may begin below the start
        (and below ``low``). Raises ``CorruptRecordError`` when a batch is missing below
        ``high`` or a header does not fit the log."""
        ...

    def batch_headers(self, start_offset: int, max_batches: int) -> list[BatchHeader]:
        """The checked headers of the stored batches from the one holding
        ``max(start_offset, low)`` upward, at most ``max_batches`` (>= 1) of them, without
        decoding their records. The first one may begin below ``low`` (a truncation inside
        it). Raises ``CorruptRecordError`` (``record_batch.CorruptBatchError``) for a batch that
        fails its checksum or is missing below ``high``."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset in [low, high) whose timestamp is >= ``timestamp_ms``, else ``high``.

        Timestamps of one log never decrease (the layer above guarantees it), so this is a binary
        search.
        """
        ...


class PartitionLog(PartitionLogReader, Protocol):
    """Read/write side of one partition log, inside a write transaction."""

    def append(self, records: Sequence[NewRecord]) -> int:
        """Append ``records`` at ``high`` as one batch; return the offset of the first. Atomic
        with the txn. Their timestamps must not decrease (ValueError, nothing written)."""
        ...

    def append_batch(
        self,
        timestamp_ms: int,
        count: int,
        records_section: bytes,
        producer_id: int = 0,
        producer_epoch: int = 0,
        first_sequence: int = 0,
    ) -> int:
        """Append a batch of ``count`` records whose section ``record_batch.prepare_records``
        made (everything of the records but their position, timestamp and checksum), all
        stamped ``timestamp_ms``; same result and atomicity as ``append``. Lets a replicated
        system encode records once, on the leader, and have every replica only stamp and
        checksum the batch (one crc, one row). A section that does not hold ``count`` records
        fails its check on read (CorruptRecordError), never returns garbage; header fields out
        of range raise ValueError before anything is written."""
        ...

    def truncate_before(self, offset: int, max_records: int | None = None) -> TruncateResult:
        """Delete records below ``offset`` (at most ``max_records`` of them, lowest first).

        ``offset`` may equal ``high`` (empties the log; ``low`` becomes ``high``) but not exceed
        it (``OffsetOutOfRangeError``). Offsets at or below ``low`` are a no-op.
        """
        ...

    def drop(self, max_records: int | None = None) -> bool:
        """Delete the log entirely, at most ``max_records`` records per call.

        Returns True when the log is gone (its watermarks are forgotten; a later append starts
        again at offset 0), False when records remain and the caller should call again.
        """
        ...


class ReadTxn(Protocol):
    """A consistent read-only view of the whole store."""

    def log(self, log_id: int) -> PartitionLogReader: ...

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Key/value pairs whose key starts with ``prefix``, in key order, from ``start``
        (inclusive; must itself start with ``prefix``) or from the first such key."""
        ...


class WriteTxn(ReadTxn, Protocol):
    """A write transaction: sees its own writes; all of it commits durably or none of it does."""

    def log(self, log_id: int) -> PartitionLog: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class StoreStat:
    file_bytes: int  # bytes the store occupies on disk (0 for memory)
    used_bytes: int  # bytes of pages in use


class Store(Protocol):
    """One node's storage. ``write()`` commits on clean exit of the ``with`` block (durably: the
    commit returns only after fsync) and aborts on an exception. Only one write transaction is
    open at a time; read transactions may run concurrently with it from other threads."""

    def write(self) -> AbstractContextManager[WriteTxn]: ...

    def read(self) -> AbstractContextManager[ReadTxn]: ...

    def stat(self) -> StoreStat: ...

    def close(self) -> None: ...

    def copy_to(self, path: str, txn: ReadTxn | None = None) -> None:
        """Write a consistent copy of the whole store to the new file ``path`` (refused if it
        exists) and fsync it. The copy shows what ``txn`` (a read transaction of this store, still
        open) sees, or the last commit when ``txn`` is None, so a caller can read from the same
        view what the copy contains. Streams: never the whole store in memory. A failure removes
        the partial file."""
        ...

    def replace_from(self, path: str) -> None:
        """Replace the whole content of the store by a copy that ``copy_to`` of the same store
        implementation wrote, in one write transaction: readers see all of the old content or all
        of the new. The copy is checked while it is read; a copy that is not one (or is damaged)
        raises ``StorageError`` and leaves the store unchanged."""
        ...

    def digest(self, exclude_kv_keys: Collection[bytes] = ()) -> str:
        """Hex sha256 of the whole logical content (see ``ContentDigest``), the same for every
        implementation holding the same content. Keys in ``exclude_kv_keys`` are left out."""
        ...


_DIGEST_LOG = struct.Struct(">cQQQQ")
_DIGEST_BATCH = struct.Struct(">cQI")
_DIGEST_KV = struct.Struct(">cHI")


class ContentDigest:
    """The canonical digest of a store's content, fed in this order: every log by ascending
    ``log_id`` (its watermarks and size, then its stored batches by ascending base offset, as
    encoded bytes), then every key/value pair by ascending key. Each item is tagged and
    length-prefixed so that no two different contents feed the same byte stream."""

    __slots__ = ("_hash",)

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"fluxmq-store-digest-1")

    def log(self, log_id: int, low: int, high: int, size_bytes: int) -> None:
        self._hash.update(_DIGEST_LOG.pack(b"L", log_id, low, high, size_bytes))

    def batch(self, base_offset: int, encoded: bytes) -> None:
        self._hash.update(_DIGEST_BATCH.pack(b"B", base_offset, len(encoded)))
        self._hash.update(encoded)

    def kv(self, key: bytes, value: bytes) -> None:
        self._hash.update(_DIGEST_KV.pack(b"K", len(key), len(value)))
        self._hash.update(key)
        self._hash.update(value)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
