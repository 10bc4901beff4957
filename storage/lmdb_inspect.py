"""A read-only look at an ``LmdbStore``'s files, for tools that audit a store (``fluxmq/audit``).

``LmdbStore`` opens its environment for writing and refuses a damaged batch or log entry by
raising. An auditor needs the opposite: never write, and report every damaged batch with what
can be said of it (its position and stored checksum) instead of stopping at the first. So this
module reads the same three databases (``batches``, ``logmeta``, ``kv``; see
``storage.lmdb_store``) raw and leaves the judgement to its caller.

Each ``LmdbInspector.view()`` is one LMDB read transaction: a consistent view of the whole
store as of one commit, however long it stays open. Opening with ``lock=True`` registers the
reader in ``lock.mdb``, which makes it safe on a live store (the writer keeps the pages the view
sees); the directory must therefore be writable, as for any LMDB reader.

A store of record format 1 (a ``log`` database, one row per record) is refused with
``OldFormatError``, as ``LmdbStore`` refuses it: ``fluxmq migrate`` rewrites it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lmdb

from storage.api import OldFormatError, StorageError
from storage.codec import position
from storage.lmdb_store import META_KEY, unpack_meta

DATA_FILE = "data.mdb"


@dataclass(frozen=True, slots=True)
class LogMeta:
    """One log's metadata entry: ``error`` is None when it passed its checks, else why not (the
    numbers are then 0)."""

    log_id: int
    low: int
    high: int
    size_bytes: int
    error: str | None


class InspectView:
    """One read transaction of an inspected store."""

    __slots__ = ("_dbs", "_txn")

    def __init__(self, txn: Any, dbs: tuple[Any, Any, Any]) -> None:
        self._txn = txn
        self._dbs = dbs

    def logs(self) -> Iterator[LogMeta]:
        """Every log's metadata entry, by log_id."""
        with self._txn.cursor(db=self._dbs[1]) as cursor:
            for key, value in cursor:
                if len(key) != META_KEY.size:
                    continue  # not a log entry; nothing of this store writes such keys
                log_id = META_KEY.unpack(key)[0]
                try:
                    low, high, size = unpack_meta(log_id, key, value)
                except StorageError as err:
                    yield LogMeta(log_id, 0, 0, 0, str(err))
                else:
                    yield LogMeta(log_id, low, high, size, None)

    def batches(self, log_id: int, start: int, end: int) -> Iterator[tuple[int, bytes, int | None]]:
        """(base offset, stored bytes, next base) of every batch of ``log_id`` whose base offset
        is in [start, end), in offset order, unchecked (see ``record_batch.decode``). ``next
        base`` is the base offset of the log's next stored batch, wherever it lies (None for
        the last one): what bounds a damaged batch whose own count cannot be trusted."""
        if start >= end:
            return
        with self._txn.cursor(db=self._dbs[0]) as cursor:
            if not cursor.set_range(position(log_id, start)):
                return
            key, value = cursor.item()
            base = _base_of(key, log_id)
            while base is not None and base < end:
                next_base: int | None = None
                next_key = next_value = b""
                if cursor.next():
                    next_key, next_value = cursor.item()
                    next_base = _base_of(next_key, log_id)
                yield base, value, next_base
                base, value = next_base, next_value

    def batches_before(self, log_id: int, offset: int) -> Iterator[tuple[int, bytes]]:
        """(base offset, stored bytes) of the batches of ``log_id`` whose base offset is below
        ``offset``, nearest first (unchecked)."""
        if offset == 0:
            return
        with self._txn.cursor(db=self._dbs[0]) as cursor:
            if cursor.set_range(position(log_id, offset)):
                if not cursor.prev():
                    return
            elif not cursor.last():
                return
            while True:
                base = _base_of(cursor.key(), log_id)
                if base is None:
                    return
                yield base, cursor.value()
                if not cursor.prev():
                    return

    def get(self, key: bytes) -> bytes | None:
        value = self._txn.get(key, db=self._dbs[2])
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Key/value table pairs whose key starts with ``prefix``, in key order, from ``start``
        (a key at or after ``prefix``) when given."""
        with self._txn.cursor(db=self._dbs[2]) as cursor:
            if not cursor.set_range(prefix if start is None else max(prefix, start)):
                return
            for key, value in cursor:
                if not key.startswith(prefix):
                    return
                yield key, value


class LmdbInspector:
    """Read-only access to the store in directory ``path`` (as ``LmdbStore`` wrote it)."""

    __slots__ = ("_dbs", "_env", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.isfile(os.path.join(path, DATA_FILE)):
            raise StorageError(f"{path!r} holds no LMDB store (no {DATA_FILE})")
        try:
            env = lmdb.open(path, readonly=True, subdir=True, max_dbs=8, lock=True, create=False)
        except lmdb.Error as e:
            raise StorageError(f"cannot open the LMDB environment at {path!r}: {e}") from e
        try:
            _refuse_format_1(env, path)
            # Without a transaction py-lmdb opens each handle in one of its own and commits it:
            # handles opened in a transaction that is aborted would be invalid afterwards.
            dbs = tuple(env.open_db(name, create=False) for name in _NAMES)
        except lmdb.Error as e:
            env.close()
            raise StorageError(f"{path!r} is not a FluxMQ store: {e}") from e
        except BaseException:
            env.close()
            raise
        self._env = env
        self._dbs: tuple[Any, Any, Any] = (dbs[0], dbs[1], dbs[2])

    @contextmanager
    def view(self) -> Iterator[InspectView]:
        txn = self._env.begin(buffers=False)
        try:
            yield InspectView(txn, self._dbs)
        finally:
            txn.abort()

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> LmdbInspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_NAMES = (b"batches", b"logmeta", b"kv")
_FORMAT_1_DB = b"log"  # record format 1: one row per record


def _refuse_format_1(env: Any, path: str) -> None:
    """OldFormatError when the environment still holds format 1's ``log`` database."""
    with env.begin() as txn, txn.cursor() as cursor:
        names = {key for key, _value in cursor}
    if _FORMAT_1_DB in names:
        raise OldFormatError(
            f"the store at {path!r} was written by FluxMQ's record format 1 (one row per "
            "message); this version reads record batches (format 2) only. With the node "
            "stopped, run `fluxmq migrate --data-dir <the node's data directory>` to rewrite it "
            "in place, then audit it"
        )


def _base_of(key: bytes, log_id: int) -> int | None:
    """The base offset of a batch key of ``log_id`` (None: another log's key, or not a key
    this store writes)."""
    if len(key) != 16 or int.from_bytes(key[:8], "big") != log_id:
        return None
    return int.from_bytes(key[8:], "big")
