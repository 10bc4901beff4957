"""storage.migrate on real format-1 LMDB environments (built from the old layout by hand):
refused before, identical after, all or nothing, idempotent, refused while held open."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from storage import LmdbStore, NewRecord, OldFormatError
from storage.codec import encode
from storage.migrate import (
    BATCH_RECORDS_MAX,
    MigrationError,
    copy_format,
    migrate_copy,
    migrate_environment,
)
from storage.record_batch import U32_MAX
from tests import format1_store as f1
from tests.format1_store import Format1Content, Format1Log

HOLD_TIMEOUT_S = 20.0


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    f1.write_env(str(path), f1.sample_content())
    return path


def test_format_1_store_is_refused_naming_fluxmq_migrate(env_dir: Path) -> None:
    with pytest.raises(OldFormatError, match="fluxmq migrate --data-dir"):
        LmdbStore(str(env_dir))


def test_migrated_store_reads_every_record_and_kv_row_back_identical(env_dir: Path) -> None:
    content = f1.sample_content()
    report = migrate_environment(str(env_dir))
    assert report.migrated
    assert (report.logs, report.records) == (3, 250 + 40)
    assert report.batches == 250 + 40  # one batch per record (see storage/migrate.py)
    assert f1.db_names(str(env_dir)) == {b"batches", b"logmeta", b"kv"}
    store = LmdbStore(str(env_dir))
    try:
        f1.assert_store_holds(store, content)
        with store.read() as txn:
            sizes = [txn.log(log_id).size_bytes() for log_id in content.logs]
        assert sum(sizes) == report.bytes_after
        assert sizes[2] == 0  # the emptied log keeps its watermarks and holds nothing
    finally:
        store.close()


def test_migrated_store_accepts_appends_after_the_migrated_records(env_dir: Path) -> None:
    log_id = next(iter(f1.sample_content().logs))
    migrate_environment(str(env_dir))
    store = LmdbStore(str(env_dir))
    try:
        with store.write() as txn:
            assert txn.log(log_id).append([NewRecord(timestamp_ms=1, value=b"new")]) == 250
        with store.read() as txn:
            assert [r.value for r in txn.log(log_id).read(249, 10, 1 << 20)][1:] == [b"new"]
    finally:
        store.close()


def test_each_record_becomes_a_batch_of_its_own_whatever_its_timestamps(tmp_path: Path) -> None:
    """Timestamps that go back or leap are kept as they were: one record per batch."""
    count = 2_000
    stamps = []
    now = 1_000_000
    for i in range(count):
        now += -5_000 if i in (500, 1_210) else (U32_MAX + 1 if i == 1_700 else i % 3)
        stamps.append(now)
    records = [
        NewRecord(timestamp_ms=ts, value=i.to_bytes(4, "big")) for i, ts in enumerate(stamps)
    ]
    path = tmp_path / "big"
    f1.write_env(str(path), Format1Content(logs={7: Format1Log(0, records)}))

    report = migrate_environment(str(path))

    assert report.batches == count
    store = LmdbStore(str(path))
    try:
        with store.read() as txn:
            headers = txn.log(7).batch_headers(0, count + 1)
            assert [h.base_offset for h in headers] == list(range(count))
            assert all(h.count == BATCH_RECORDS_MAX == 1 for h in headers)
            assert [h.first_timestamp_ms for h in headers] == stamps
        f1.assert_store_holds(store, Format1Content(logs={7: Format1Log(0, records)}))
    finally:
        store.close()


def test_a_replica_that_replays_format_1_entries_holds_what_one_that_migrated_them_holds(
    tmp_path: Path,
) -> None:
    """Replicas stop at different applied indexes: one migrates the records the other still
    has to replay from its format-1 log entries. Both end with the same batches (digest)."""
    from fluxmq._pb.internal import commands_pb2 as cpb
    from fluxmq._pb.v1 import queue_pb2 as pb
    from fluxmq.core import commands
    from fluxmq.core.queue_config import normalize_new
    from fluxmq.core.state_machine import QueueStateMachine
    from storage.codec import prepare

    class E:
        def __init__(self, index: int, payload: bytes) -> None:
            self.index, self.payload = index, payload

    cfg = normalize_new(pb.QueueConfig(name="q", partitions=1))
    create = cpb.CreateQueueCmd(config=cfg, now_ms=1_000)
    # Format-1 entries as a version before record batches proposed them: prepared records.
    appends = [
        cpb.AppendCmd(
            queue="q",
            queue_id=1,
            now_ms=2_000 + n,
            records=[prepare(b"v%d-%d" % (n, k)) for k in range(3)],
            partitions=[0, 0, 0],
        )
        for n in range(4)
    ]
    entries = [E(i + 1, commands.encode(c)) for i, c in enumerate([create, *appends])]
    # Replica A applied everything; replica B stopped two entries behind. In format 1 both
    # held the records of what they applied; model that by migrating a format-1 copy of it.
    digests = []
    for applied in (len(entries), len(entries) - 2):
        live = LmdbStore(str(tmp_path / f"live{applied}"))
        sm = QueueStateMachine(live)
        sm.apply_batch(entries[:applied])
        with live.read() as txn:
            log = txn.log(1 << 20)
            wm = log.watermarks()
            records = log.read(wm.low, 1000, 1 << 30) if wm.high else []
            kv = list(txn.scan(b""))
        live.close()
        content = Format1Content(
            logs={1 << 20: Format1Log(0, [
                NewRecord(r.timestamp_ms, r.value, r.key, r.headers, r.idempotency_key)
                for r in records
            ])} if records else {},
            kv=dict(kv),
        )  # fmt: skip
        path = tmp_path / f"f1-{applied}"
        f1.write_env(str(path), content)
        migrate_environment(str(path))
        store = LmdbStore(str(path))
        sm = QueueStateMachine(store)
        sm.apply_batch(entries[applied:])  # B replays its last format-1 entries now
        digests.append(sm.digest())
        store.close()
    assert digests[0] == digests[1]


def test_damaged_row_refuses_the_migration_naming_log_and_offset_and_changes_nothing(
    env_dir: Path,
) -> None:
    log_id = next(iter(f1.sample_content().logs))
    row = bytearray(f1.row_at(str(env_dir), log_id, 123))
    row[-1] ^= 0x40
    f1.put_row(str(env_dir), log_id, 123, bytes(row))
    before = file_sha256(env_dir / "data.mdb")

    with pytest.raises(MigrationError, match=rf"log {log_id} at offset 123: crc32c mismatch"):
        migrate_environment(str(env_dir))

    assert file_sha256(env_dir / "data.mdb") == before
    assert b"log" in f1.db_names(str(env_dir))
    with pytest.raises(OldFormatError):
        LmdbStore(str(env_dir))


def test_missing_row_below_high_refuses_the_migration(env_dir: Path) -> None:
    log_id = next(iter(f1.sample_content().logs))
    f1.delete_row(str(env_dir), log_id, 200)
    before = file_sha256(env_dir / "data.mdb")
    with pytest.raises(MigrationError, match=rf"log {log_id} has no row at offset 200"):
        migrate_environment(str(env_dir))
    assert file_sha256(env_dir / "data.mdb") == before


@pytest.mark.parametrize(
    ("log_id", "offset", "problem"),
    [
        (1 << 20 | 1, 3, r"outside its \[low, high\) = \[17, 57\)"),  # below low
        (1 << 20 | 1, 57, r"outside its \[low, high\) = \[17, 57\)"),  # at high
        (99, 0, "log 99 has a row at offset 0 but no metadata"),
    ],
)
def test_row_outside_every_log_s_watermarks_refuses_the_migration(
    env_dir: Path, log_id: int, offset: int, problem: str
) -> None:
    f1.put_row(str(env_dir), log_id, offset, encode(log_id, offset, NewRecord(1, b"stray")))
    before = file_sha256(env_dir / "data.mdb")
    with pytest.raises(MigrationError, match=problem):
        migrate_environment(str(env_dir))
    assert file_sha256(env_dir / "data.mdb") == before


def test_damaged_log_metadata_refuses_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "store"
    content = Format1Content(logs={3: Format1Log(0, [NewRecord(1, b"a")])})
    f1.write_env(str(path), content)
    env = lmdb.open(str(path), map_size=f1.MAP_SIZE_BYTES, max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(b"logmeta", txn=txn)
            bad = bytearray(f1.meta_value(3, 0, 1, 99))
            bad[-1] ^= 1
            txn.put((3).to_bytes(8, "big"), bytes(bad), db=meta)
    finally:
        env.close()
    with pytest.raises(MigrationError, match="metadata of log 3 failed its crc32c check"):
        migrate_environment(str(path))


def test_second_migration_finds_format_2_and_does_nothing(env_dir: Path) -> None:
    migrate_environment(str(env_dir))
    before = file_sha256(env_dir / "data.mdb")
    report = migrate_environment(str(env_dir))
    assert not report.migrated
    assert report.describe().endswith("already format 2, nothing to do")
    assert file_sha256(env_dir / "data.mdb") == before


@pytest.fixture
def held_store(env_dir: Path) -> Iterator[Path]:
    """The store held open by another process, as a running node holds it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lmdb, sys; env = lmdb.open(sys.argv[1], max_dbs=8); "
            "print('open', flush=True); sys.stdin.read()",
            str(env_dir),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        yield env_dir
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(HOLD_TIMEOUT_S)


def test_store_held_open_by_another_process_is_refused_unchanged(held_store: Path) -> None:
    before = file_sha256(held_store / "data.mdb")
    with pytest.raises(MigrationError, match="stop the node first"):
        migrate_environment(str(held_store))
    assert file_sha256(held_store / "data.mdb") == before


def test_store_left_unsynced_by_an_earlier_boot_is_not_migrated(env_dir: Path) -> None:
    """The node discards such a store at start (it may be torn) and rebuilds it from Raft."""
    (env_dir / "unsynced-since-boot").write_text("another-boot")
    before = file_sha256(env_dir / "data.mdb")
    report = migrate_environment(str(env_dir))
    assert not report.migrated
    assert "earlier boot" in report.describe()
    assert file_sha256(env_dir / "data.mdb") == before


def test_migrated_copy_replaces_a_store_with_the_same_content(
    env_dir: Path, tmp_path: Path
) -> None:
    content = f1.sample_content()
    old_copy = tmp_path / "old.copy"
    f1.write_copy(str(env_dir), str(old_copy))
    assert copy_format(str(old_copy)) == 1
    new_copy = tmp_path / "new.copy"

    report = migrate_copy(str(old_copy), str(new_copy))

    assert report.records == 290
    assert copy_format(str(new_copy)) == 2
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".fluxmq-migrate-")]
    store = LmdbStore(str(tmp_path / "fresh"))
    try:
        store.replace_from(str(new_copy))
        f1.assert_store_holds(store, content)
    finally:
        store.close()


def test_damaged_copy_is_refused_before_lmdb_reads_it(env_dir: Path, tmp_path: Path) -> None:
    old_copy = tmp_path / "old.copy"
    f1.write_copy(str(env_dir), str(old_copy))
    data = bytearray(old_copy.read_bytes())
    data[len(data) // 3] ^= 0xFF
    old_copy.write_bytes(bytes(data))
    with pytest.raises(MigrationError, match="sha256 does not match"):
        migrate_copy(str(old_copy), str(tmp_path / "new.copy"))
    assert not (tmp_path / "new.copy").exists()


def test_kill_9_in_the_middle_of_the_migration_leaves_the_format_1_store_whole(
    tmp_path: Path,
) -> None:
    """The process dies (SIGKILL) with half the batches written in its transaction: the store
    is still the format-1 one, and a second run migrates all of it."""
    path = tmp_path / "store"
    records = [NewRecord(timestamp_ms=i, value=b"v%d" % i * 50) for i in range(5_000)]
    content = Format1Content(logs={5: Format1Log(0, records)}, kv={b"M/applied": b"\x00" * 8})
    f1.write_env(str(path), content)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from storage import migrate\n"
            "flush = migrate._BatchWriter.flush\n"
            "def dying_flush(self):\n"
            "    if self.batches == 3:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    flush(self)\n"
            "migrate._BatchWriter.flush = dying_flush\n"
            "migrate.migrate_environment(sys.argv[1])\n",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=HOLD_TIMEOUT_S,
    )
    assert child.returncode == -9, child.stderr

    assert b"log" in f1.db_names(str(path))
    with pytest.raises(OldFormatError):
        LmdbStore(str(path))
    report = migrate_environment(str(path))
    assert (report.records, report.batches) == (5_000, 5_000)
    store = LmdbStore(str(path))
    try:
        f1.assert_store_holds(store, content)
    finally:
        store.close()
