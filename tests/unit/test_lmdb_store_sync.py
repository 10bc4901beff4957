"""How a store commits: fully synced alone, one fsync per commit when a Raft journal replays it."""

from __future__ import annotations

from pathlib import Path

from storage.lmdb_store import LmdbStore


def _flags(store: LmdbStore) -> dict[str, bool]:
    return dict(store._env.flags())


def test_a_store_alone_syncs_data_and_meta_on_every_commit(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "s"), map_size_bytes=1 << 24)
    try:
        flags = _flags(store)
        assert flags["sync"] and flags["metasync"], "the only copy must keep its last commit"
    finally:
        store.close()


def test_a_store_a_raft_journal_replays_syncs_data_but_not_the_meta_page(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "s"), map_size_bytes=1 << 24, last_commit_replayable=True)
    try:
        flags = _flags(store)
        # Data pages still reach the disk before a commit returns (never a corrupt file); only
        # the meta page that follows may lag, which can undo the last commit: the journal
        # applies it again.
        assert flags["sync"] and not flags["metasync"]
        with store.write() as txn:
            txn.put(b"k", b"v")
        with store.read() as txn:
            assert txn.get(b"k") == b"v"
    finally:
        store.close()
