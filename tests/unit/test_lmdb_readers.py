"""LMDB read transactions give their reader slot back when they end, not when the garbage
collector happens to run: a burst of reads (GetQueueStats, ListDeadLetters, scrapes) must not
exhaust the environment's readers (MDB_READERS_FULL)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import grpc
import lmdb
import pytest

from fluxmq.server.errors import domain_error, status_code
from storage import LmdbStore, StorageBusyError, StorageError
from storage.lmdb_store import MAX_READERS


def test_a_read_transaction_frees_its_reader_slot_when_it_ends_even_after_opening_logs(
    tmp_path: Path,
) -> None:
    store = LmdbStore(str(tmp_path / "db"), sync=False)
    enabled = gc.isenabled()
    gc.disable()  # only reference counting: what a busy process gets between collections
    try:
        for _ in range(MAX_READERS + 50):
            with store.read() as txn:
                assert txn.log(7).watermarks().high == 0
    finally:
        if enabled:
            gc.enable()
        store.close()


def test_no_read_transaction_keeps_its_reader_slot_after_its_with_block(tmp_path: Path) -> None:
    """A caller may keep the transaction or a log it opened after the ``with`` (a Tail stream
    between two messages): the slot is still given back when the block ends."""
    store = LmdbStore(str(tmp_path / "db"), sync=False)
    kept: list[object] = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(MAX_READERS + 50):
            with store.read() as txn:
                log = txn.log(i % 3)
                assert log.watermarks().high == 0
            kept.append((txn, log))
        with pytest.raises(StorageError, match="ended"):
            log.watermarks()  # ended, not a view of a reused slot
    finally:
        if enabled:
            gc.enable()
        store.close()


def test_a_full_reader_table_is_a_retriable_busy_error_never_internal(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "db"), sync=False)
    env = store._live_env()
    held: list[Any] = []
    try:
        with pytest.raises(lmdb.ReadersFullError):
            for _ in range(MAX_READERS + 1):  # other holders take every slot
                held.append(env.begin(write=False))
        with pytest.raises(StorageBusyError) as exc, store.read() as txn:
            txn.log(1).watermarks()
        err = domain_error(exc.value)
        assert err is not None
        assert err.reason == "STORAGE_BUSY" and err.retriable and err.retry_after_ms
        assert status_code(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for raw in held:
            raw.abort()
        held.clear()
        store.close()
