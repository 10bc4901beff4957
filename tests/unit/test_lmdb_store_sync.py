"""How a store commits: fully synced alone; as a cache of a Raft log, without fsync, discarded
(to be rebuilt by the log) when the machine went down while it was unsynced."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from storage import unsynced_marker
from storage.lmdb_store import LmdbStore

MAP_BYTES = 1 << 24


def _flags(store: LmdbStore) -> dict[str, bool]:
    return dict(store._env.flags())


def _boot(boot_id: str | None) -> Callable[[], str | None]:
    return lambda: boot_id


def _put(path: Path, boot_id: str, key: bytes) -> LmdbStore:
    store = LmdbStore(str(path), MAP_BYTES, cache_of_log=True, boot_id=_boot(boot_id))
    with store.write() as txn:
        txn.put(key, b"v")
    return store


def _get(path: Path, boot_id: str, key: bytes) -> tuple[bytes | None, bool]:
    store = LmdbStore(str(path), MAP_BYTES, cache_of_log=True, boot_id=_boot(boot_id))
    try:
        with store.read() as txn:
            return txn.get(key), store.discarded_after_machine_crash
    finally:
        store.close()


def test_a_store_alone_syncs_data_and_meta_on_every_commit(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "s"), map_size_bytes=MAP_BYTES)
    try:
        flags = _flags(store)
        assert flags["sync"] and flags["metasync"], "the only copy must keep its last commit"
        assert not (tmp_path / "s" / unsynced_marker.MARKER_NAME).exists()
    finally:
        store.close()


def test_a_cache_of_the_log_commits_without_fsync_after_marking_the_boot(tmp_path: Path) -> None:
    store = _put(tmp_path / "s", "boot-a", b"k")
    try:
        flags = _flags(store)
        assert not flags["sync"] and not flags["metasync"]
        # Durable before the first unsynced commit: the next open must find it.
        assert unsynced_marker.marked_boot_id(str(tmp_path / "s")) == "boot-a"
    finally:
        store.close()
    # A clean close flushed everything: nothing is left unsynced.
    assert unsynced_marker.marked_boot_id(str(tmp_path / "s")) is None


def test_a_process_crash_keeps_the_cache(tmp_path: Path) -> None:
    store = _put(tmp_path / "s", "boot-a", b"k")
    store._env.close()  # no clean close: the marker stays, as after kill -9
    assert unsynced_marker.marked_boot_id(str(tmp_path / "s")) == "boot-a"
    # Same boot: the page cache had every commit.
    assert _get(tmp_path / "s", "boot-a", b"k") == (b"v", False)


def test_a_machine_crash_while_unsynced_discards_the_cache_for_the_log_to_rebuild(
    tmp_path: Path,
) -> None:
    store = _put(tmp_path / "s", "boot-a", b"k")
    store._env.close()
    # Another boot id: the machine went down with commits that may never have reached the disk.
    assert _get(tmp_path / "s", "boot-b", b"k") == (None, True)
    assert unsynced_marker.marked_boot_id(str(tmp_path / "s")) is None  # closed cleanly since


def test_a_cleanly_closed_cache_survives_a_reboot(tmp_path: Path) -> None:
    _put(tmp_path / "s", "boot-a", b"k").close()
    assert _get(tmp_path / "s", "boot-b", b"k") == (b"v", False)


def test_without_a_boot_id_the_cache_fsyncs_its_data_pages(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "s"), MAP_BYTES, cache_of_log=True, boot_id=_boot(None))
    try:
        flags = _flags(store)
        # Without a way to tell a machine crash, the data pages still reach the disk before a
        # commit returns (never a torn file); only the meta page may lag (the journal replays
        # the last commit).
        assert flags["sync"] and not flags["metasync"]
        assert not os.path.exists(tmp_path / "s" / unsynced_marker.MARKER_NAME)
    finally:
        store.close()


def test_the_running_kernel_has_a_boot_id() -> None:
    boot_id = unsynced_marker.current_boot_id()
    assert boot_id is not None and boot_id == unsynced_marker.current_boot_id()
