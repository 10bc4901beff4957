"""FluxMQ's storage library: partition logs and a key/value table in one transactional store.

Independent of the layers above it: it knows only numbered logs and opaque bytes.
"""

from storage.api import (
    ContentDigest,
    CorruptRecordError,
    NewRecord,
    OffsetOutOfRangeError,
    OldFormatError,
    PartitionLog,
    PartitionLogReader,
    ReadTxn,
    Record,
    StorageBusyError,
    StorageError,
    StorageFullError,
    Store,
    StoredBatch,
    StoreStat,
    TruncateResult,
    Watermarks,
    WriteTxn,
)
from storage.lmdb_store import LmdbStore
from storage.memory_store import MemoryStore

__all__ = [
    "ContentDigest",
    "CorruptRecordError",
    "LmdbStore",
    "MemoryStore",
    "NewRecord",
    "OffsetOutOfRangeError",
    "OldFormatError",
    "PartitionLog",
    "PartitionLogReader",
    "ReadTxn",
    "Record",
    "StorageBusyError",
    "StorageError",
    "StorageFullError",
    "Store",
    "StoreStat",
    "StoredBatch",
    "TruncateResult",
    "Watermarks",
    "WriteTxn",
]
