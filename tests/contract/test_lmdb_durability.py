"""What LmdbStore promises about the disk: it survives a restart, and damage is detected.

The damage tests edit the files behind the store's back (raw bytes, or raw LMDB writes), then
check that the store refuses the damaged data instead of returning it. A log is stored as record
batches (one row of the ``batches`` database per append), so damage is reported for the whole
batch that holds it.
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import lmdb
import pytest
from crc32c import crc32c

from storage import (
    CorruptRecordError,
    LmdbStore,
    NewRecord,
    OldFormatError,
    ReadTxn,
    Record,
    StorageError,
    Watermarks,
)
from storage.codec import decode, encode, position
from storage.record_batch import CorruptBatchError

CANARY = b"FLUXMQ-CANARY-" * 8


def rec(value: bytes, timestamp_ms: int = 1_000) -> NewRecord:
    return NewRecord(timestamp_ms=timestamp_ms, value=value)


def read_one(store: LmdbStore, log_id: int, offset: int) -> Record:
    with store.read() as txn:
        records = txn.log(log_id).read(offset, 1, 2**40)
    assert [r.offset for r in records] == [offset]
    return records[0]


def raw_env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), max_dbs=8, subdir=True)


def _logs_snapshot(txn: ReadTxn, log_ids: tuple[int, ...]) -> dict[int, object]:
    """Everything observable of some logs: watermarks, size and records."""
    return {
        log_id: (
            txn.log(log_id).watermarks(),
            txn.log(log_id).size_bytes(),
            txn.log(log_id).read(0, 1000, 2**40),
        )
        for log_id in log_ids
    }


def test_reopen_preserves_watermarks_sizes_records_and_keys(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = LmdbStore(path)
    with store.write() as txn:
        txn.log(1).append([rec(b"a" * n, timestamp_ms=n) for n in range(1, 30)])
        txn.log(2).append([rec(b"b")])
        txn.log(3).append([rec(b"c"), rec(b"d")])
        txn.put(b"consumer/1", b"offset 5")
    with store.write() as txn:
        txn.log(1).truncate_before(7)
        assert txn.log(3).drop()
    with store.read() as txn:
        before = _logs_snapshot(txn, (1, 2, 3))
    store.close()

    reopened = LmdbStore(path)
    try:
        with reopened.read() as txn:
            after = _logs_snapshot(txn, (1, 2, 3))
            assert txn.get(b"consumer/1") == b"offset 5"
            assert txn.log(1).offset_for_timestamp(10) == 9
        assert after == before
        assert after[1][0] == Watermarks(7, 29)
        assert after[3][0] == Watermarks(0, 0)
        with reopened.write() as txn:
            assert txn.log(1).append([rec(b"next", timestamp_ms=99)]) == 29
            assert txn.log(3).append([rec(b"again")]) == 0
    finally:
        reopened.close()


def batch_rows(path: Path) -> list[bytes]:
    """The keys of the ``batches`` database, read with raw LMDB (the store closed)."""
    env = raw_env(path)
    try:
        with env.begin() as txn:
            db = env.open_db(b"batches", txn=txn, create=False)
            return [key for key, _value in txn.cursor(db=db)]
    finally:
        env.close()


def test_each_append_is_one_row_of_the_batches_database(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = LmdbStore(str(path))
    with store.write() as txn:
        txn.log(1).append([rec(bytes([i])) for i in range(100)])
        txn.log(1).append([rec(b"one")])
        txn.log(2).append([rec(b"a"), rec(b"b")])
    store.close()
    assert batch_rows(path) == [position(1, 0), position(1, 100), position(2, 0)]


def test_flipped_byte_in_lmdb_file_is_detected_by_crc(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = LmdbStore(str(path))
    values = [f"record {i}".encode() for i in range(10)]
    values[5] = CANARY
    with store.write() as txn:
        txn.log(4).append([rec(v) for v in values[:4]])  # [0, 3]
        txn.log(4).append([rec(v) for v in values[4:7]])  # [4, 6], the canary at 5
        txn.log(4).append([rec(v) for v in values[7:]])  # [7, 9]
    store.close()

    data = bytearray((path / "data.mdb").read_bytes())
    hits = []
    at = data.find(CANARY)
    while at != -1:
        hits.append(at)
        at = data.find(CANARY, at + 1)
    # One transaction wrote the canary, so it sits on exactly one page.
    assert len(hits) == 1
    data[hits[0] + len(CANARY) // 2] ^= 0x01
    (path / "data.mdb").write_bytes(bytes(data))

    store = LmdbStore(str(path))
    try:
        with store.read() as txn:
            log = txn.log(4)
            for start in (5, 4, 6):
                with pytest.raises(CorruptBatchError) as caught:
                    log.read(start, 1, 2**40)
                error = caught.value
                # The whole batch holding the damage is refused, and says which offsets it held.
                assert (error.log_id, error.first_offset, error.last_offset) == (4, 4, 6)
            # A read that reaches the damaged batch fails rather than stopping short silently.
            with pytest.raises(CorruptRecordError):
                log.read(0, 100, 2**40)
            assert [r.value for r in log.read(0, 4, 2**40)] == values[:4]
            assert [r.value for r in log.read(7, 100, 2**40)] == values[7:]
        with pytest.raises(CorruptRecordError):
            store.digest()
    finally:
        store.close()


def test_batch_moved_to_another_offset_or_log_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = LmdbStore(str(path))
    with store.write() as txn:
        for i in range(5):
            txn.log(1).append([rec(f"one/{i}".encode())])
            txn.log(2).append([rec(f"two/{i}".encode())])
    store.close()

    env = raw_env(path)
    with env.begin(write=True) as txn:
        batches_db = env.open_db(b"batches", txn=txn, create=False)
        # Intact bytes, valid crc for where they were written, but put at another position.
        value = txn.get(position(1, 3), db=batches_db)
        assert value is not None
        txn.put(position(1, 4), value, db=batches_db)
        txn.put(position(2, 3), value, db=batches_db)
    env.close()

    store = LmdbStore(str(path))
    try:
        assert read_one(store, 1, 3).value == b"one/3"
        for log_id, offset in ((1, 4), (2, 3)):
            with store.read() as reader, pytest.raises(CorruptBatchError) as caught:
                reader.log(log_id).read(offset, 1, 2**40)
            assert (caught.value.log_id, caught.value.first_offset) == (log_id, offset)
    finally:
        store.close()


def test_missing_batch_below_high_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = LmdbStore(str(path))
    with store.write() as txn:
        for i in range(0, 6, 2):
            txn.log(1).append([rec(bytes([i]), timestamp_ms=i), rec(b"", timestamp_ms=i + 1)])
    store.close()

    env = raw_env(path)
    with env.begin(write=True) as txn:
        assert txn.delete(position(1, 2), db=env.open_db(b"batches", txn=txn, create=False))
    env.close()

    store = LmdbStore(str(path))
    try:
        with store.read() as txn:
            with pytest.raises(CorruptRecordError) as caught:
                txn.log(1).read(0, 10, 2**40)
            assert caught.value.offset == 2
            with pytest.raises(CorruptRecordError):
                txn.log(1).read(3, 10, 2**40)
            with pytest.raises(CorruptRecordError):
                txn.log(1).offset_for_timestamp(2)
            with pytest.raises(CorruptRecordError):
                txn.log(1).batch_headers(0, 10)
            assert [r.offset for r in txn.log(1).read(4, 10, 2**40)] == [4, 5]
        with pytest.raises(CorruptRecordError):
            store.digest()
        with pytest.raises(CorruptRecordError), store.write() as wtxn:
            wtxn.log(1).truncate_before(4)
        # The failed truncation was rolled back with its transaction.
        with store.read() as txn:
            assert txn.log(1).watermarks() == Watermarks(0, 6)
    finally:
        store.close()


def test_store_written_by_record_format_1_is_refused_naming_the_migration(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    env = raw_env(path)
    with env.begin(write=True) as txn:
        old_db = env.open_db(b"log", txn=txn)
        env.open_db(b"logmeta", txn=txn)
        env.open_db(b"kv", txn=txn)
        txn.put(position(1, 0), encode(1, 0, rec(b"old")), db=old_db)
    env.close()

    with pytest.raises(OldFormatError, match="fluxmq migrate --data-dir") as caught:
        LmdbStore(str(path))
    assert isinstance(caught.value, StorageError)
    # Refused before anything was written: the old rows are still there, nothing new was added.
    env = raw_env(path)
    try:
        with env.begin() as txn:
            names = sorted(key for key, _value in txn.cursor())
            old_db = env.open_db(b"log", txn=txn, create=False)
            assert txn.get(position(1, 0), db=old_db) == encode(1, 0, rec(b"old"))
    finally:
        env.close()
    assert names == [b"kv", b"log", b"logmeta"]


def test_copy_holds_exactly_the_batches_logmeta_and_kv_databases(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "db"))
    try:
        with store.write() as txn:
            txn.log(1).append([rec(b"a"), rec(b"b")])
            txn.put(b"k", b"v")
        store.copy_to(str(tmp_path / "copy"))
    finally:
        store.close()
    env = lmdb.open(str(tmp_path / "copy"), subdir=False, readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            names = sorted(key for key, _value in txn.cursor())
            batches_db = env.open_db(b"batches", txn=txn, create=False)
            assert [key for key, _value in txn.cursor(db=batches_db)] == [position(1, 0)]
    finally:
        env.close()
    assert names == [b"batches", b"kv", b"logmeta"]


def test_damaged_log_metadata_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = LmdbStore(str(path))
    with store.write() as txn:
        txn.log(1).append([rec(b"a"), rec(b"b")])
    store.close()

    env = raw_env(path)
    with env.begin(write=True) as txn:
        meta_db = env.open_db(b"logmeta", txn=txn)
        key = struct.pack(">Q", 1)
        stored = txn.get(key, db=meta_db)
        assert stored is not None
        meta = bytearray(stored)
        meta[15] ^= 0x04  # high: 2 -> 6
        txn.put(key, bytes(meta), db=meta_db)
    env.close()

    store = LmdbStore(str(path))
    try:
        with store.read() as txn, pytest.raises(StorageError, match="crc32c"):
            txn.log(1)
    finally:
        store.close()


def test_reader_in_another_thread_keeps_its_snapshot_while_the_writer_commits(
    tmp_path: Path,
) -> None:
    store = LmdbStore(str(tmp_path / "db"))
    with store.write() as txn:
        txn.log(1).append([rec(b"first")])
    reader_open = threading.Event()
    writer_done = threading.Event()
    seen: list[object] = []

    def reader() -> None:
        try:
            with store.read() as txn:
                before = txn.log(1).read(0, 10, 2**40)
                reader_open.set()
                assert writer_done.wait(10)
                after = txn.log(1).read(0, 10, 2**40)
                seen.append(([r.value for r in before], [r.value for r in after]))
            with store.read() as txn:
                seen.append([r.value for r in txn.log(1).read(0, 10, 2**40)])
        except BaseException as e:  # surfaced by the assertion below
            seen.append(e)
            reader_open.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert reader_open.wait(10)
        with store.write() as txn:
            txn.log(1).append([rec(b"second")])
        writer_done.set()
        thread.join(10)
        assert seen == [([b"first"], [b"first"]), [b"first", b"second"]]
    finally:
        writer_done.set()
        thread.join(10)
        store.close()


def test_opening_a_store_twice_in_one_process_is_refused(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path / "db"))
    try:
        with pytest.raises(StorageError):
            LmdbStore(str(tmp_path / "db"))
    finally:
        store.close()


# The codec is what makes the checks above possible; these pin its guarantees byte by byte.


def test_every_single_byte_flip_of_a_record_is_detected() -> None:
    record = NewRecord(
        timestamp_ms=1_700_000_000_000,
        value=b"value bytes",
        key=b"key",
        headers=(("h", b"\x00\x01"),),
        idempotency_key="idem",
    )
    encoded = encode(9, 42, record)
    assert decode(9, 42, encoded).value == b"value bytes"
    for at in range(len(encoded)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(encoded)
            damaged[at] ^= flip
            with pytest.raises(CorruptRecordError):
                decode(9, 42, bytes(damaged))


@pytest.mark.parametrize("cut", [1, 5, 26])
def test_truncated_or_extended_record_is_detected(cut: int) -> None:
    encoded = encode(1, 1, NewRecord(timestamp_ms=1, value=b"v" * 40, key=b"k"))
    with pytest.raises(CorruptRecordError):
        decode(1, 1, encoded[:-cut])
    with pytest.raises(CorruptRecordError):
        decode(1, 1, encoded + b"\x00" * cut)
    with pytest.raises(CorruptRecordError):
        decode(1, 1, b"")


def _with_valid_crc(log_id: int, offset: int, body: bytes) -> bytes:
    return struct.pack(">I", crc32c(body, crc32c(position(log_id, offset)))) + body


def test_inconsistent_lengths_are_refused_even_with_a_valid_crc() -> None:
    encoded = encode(1, 1, NewRecord(timestamp_ms=1, value=b"v" * 40, key=b"k"))
    body = bytearray(encoded[4:])
    body[12] += 1  # the low byte of the key length (u32 at body[9:13])
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        decode(1, 1, _with_valid_crc(1, 1, bytes(body)))
    unknown_format = bytes([2]) + encoded[5:]
    with pytest.raises(CorruptRecordError, match="format"):
        decode(1, 1, _with_valid_crc(1, 1, unknown_format))
