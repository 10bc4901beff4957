"""LMDB read transactions give their reader slot back when they end, not when the garbage
collector happens to run: a burst of reads (GetQueueStats, ListDeadLetters, scrapes) must not
exhaust the environment's readers (MDB_READERS_FULL)."""

from __future__ import annotations

import gc
from pathlib import Path

from storage import LmdbStore
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
