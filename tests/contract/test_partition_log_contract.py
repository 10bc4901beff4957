"""The storage contract (storage/api.py), checked against every implementation.

Every test runs on LmdbStore and on MemoryStore; the last one also drives both with the same
random operations and requires identical answers, so the twin stays a faithful stand-in.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import (
    LmdbStore,
    MemoryStore,
    NewRecord,
    OffsetOutOfRangeError,
    PartitionLog,
    Record,
    StorageError,
    StorageFullError,
    Store,
    Watermarks,
    WriteTxn,
)
from storage.api import (
    IDEMPOTENCY_KEY_BYTES_MAX,
    LOG_ID_MAX,
    RECORD_HEADERS_MAX,
    RECORD_KEY_BYTES_MAX,
    RECORD_VALUE_BYTES_MAX,
)
from storage.codec import KV_KEY_BYTES_MAX, encode

MiB = 1024 * 1024
StoreFactory = Callable[[int], Store]


@pytest.fixture(params=["lmdb", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds stores of one implementation with a size limit; closes them afterwards."""
    made: list[Store] = []

    def make(limit_bytes: int = 512 * MiB) -> Store:
        store: Store
        if request.param == "lmdb":
            # No fsync: this suite is about semantics; test_lmdb_durability covers the disk.
            path = tmp_path / f"store{len(made)}"
            store = LmdbStore(str(path), map_size_bytes=limit_bytes, sync=False)
        else:
            store = MemoryStore(max_bytes=limit_bytes)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store(512 * MiB)


def rec(
    value: bytes = b"v",
    timestamp_ms: int = 1_000,
    key: bytes | None = None,
    headers: tuple[tuple[str, bytes], ...] = (),
    idempotency_key: str | None = None,
) -> NewRecord:
    return NewRecord(timestamp_ms, value, key, headers, idempotency_key)


def append(store: Store, log_id: int, records: list[NewRecord]) -> int:
    with store.write() as txn:
        return txn.log(log_id).append(records)


def read_all(store: Store, log_id: int) -> list[Record]:
    with store.read() as txn:
        return txn.log(log_id).read(0, 2**32, 2**62)


def watermarks(store: Store, log_id: int) -> Watermarks:
    with store.read() as txn:
        return txn.log(log_id).watermarks()


def size_bytes(store: Store, log_id: int) -> int:
    with store.read() as txn:
        return txn.log(log_id).size_bytes()


class Boom(Exception):
    pass


# --- appending and reading -------------------------------------------------------------------


def test_never_written_log_is_empty_at_zero(store: Store) -> None:
    with store.read() as txn:
        log = txn.log(7)
        assert log.log_id == 7
        assert log.watermarks() == Watermarks(0, 0)
        assert log.size_bytes() == 0
        assert log.read(0, 10, 10_000) == []
        assert log.offset_for_timestamp(0) == 0


def test_append_assigns_contiguous_offsets_from_high(store: Store) -> None:
    assert append(store, 1, [rec(b"a"), rec(b"b"), rec(b"c")]) == 0
    assert append(store, 1, [rec(b"d"), rec(b"e")]) == 3
    assert watermarks(store, 1) == Watermarks(0, 5)
    records = read_all(store, 1)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert [r.value for r in records] == [b"a", b"b", b"c", b"d", b"e"]


def test_appends_in_one_transaction_continue_each_other(store: Store) -> None:
    with store.write() as txn:
        assert txn.log(1).append([rec(b"a")]) == 0
        assert txn.log(1).append([rec(b"b"), rec(b"c")]) == 1
        assert txn.log(1).watermarks() == Watermarks(0, 3)
        assert [r.value for r in txn.log(1).read(0, 10, 10_000)] == [b"a", b"b", b"c"]
    assert watermarks(store, 1) == Watermarks(0, 3)


def test_append_of_nothing_returns_high_and_writes_nothing(store: Store) -> None:
    append(store, 1, [rec(), rec()])
    assert append(store, 1, []) == 2
    assert append(store, 2, []) == 0
    assert watermarks(store, 1) == Watermarks(0, 2)
    assert watermarks(store, 2) == Watermarks(0, 0)


def test_size_bytes_is_the_sum_of_record_sizes(store: Store) -> None:
    append(store, 1, [rec(b"x" * n, key=b"k" * n) for n in (0, 1, 100, 5000)])
    records = read_all(store, 1)
    assert size_bytes(store, 1) == sum(r.size_bytes for r in records)
    for r, n in zip(records, (0, 1, 100, 5000), strict=True):
        assert r.size_bytes == len(encode(1, r.offset, rec(b"x" * n, key=b"k" * n)))


def test_read_respects_max_records_and_stops_at_high(store: Store) -> None:
    append(store, 1, [rec(bytes([i])) for i in range(10)])
    with store.read() as txn:
        log = txn.log(1)
        assert [r.offset for r in log.read(2, 3, 10_000)] == [2, 3, 4]
        assert [r.offset for r in log.read(8, 100, 10_000)] == [8, 9]
        assert log.read(10, 5, 10_000) == []
        assert log.read(11, 5, 10_000) == []


def test_read_respects_byte_limit_but_returns_one_oversize_record(store: Store) -> None:
    append(store, 1, [rec(b"a" * 100), rec(b"b" * 100), rec(b"c" * 5000), rec(b"d")])
    with store.read() as txn:
        log = txn.log(1)
        one = log.read(0, 1, 10_000)[0].size_bytes
        # Exactly two records' worth: the third would go over.
        assert [r.offset for r in log.read(0, 10, 2 * one)] == [0, 1]
        assert [r.offset for r in log.read(0, 10, 2 * one - 1)] == [0]
        # A record larger than the limit still comes back alone, so a reader is never stuck.
        assert [r.offset for r in log.read(2, 10, 10)] == [2]
        assert [r.offset for r in log.read(0, 10, 0)] == [0]


def test_read_below_low_starts_at_low(store: Store) -> None:
    append(store, 1, [rec(bytes([i])) for i in range(6)])
    with store.write() as txn:
        txn.log(1).truncate_before(4)
    with store.read() as txn:
        assert [r.offset for r in txn.log(1).read(0, 10, 10_000)] == [4, 5]


@pytest.mark.parametrize(
    ("start", "max_records", "max_bytes"), [(-1, 1, 1), (0, 0, 1), (0, -3, 1), (0, 1, -1)]
)
def test_read_rejects_invalid_arguments(
    store: Store, start: int, max_records: int, max_bytes: int
) -> None:
    append(store, 1, [rec()])
    with store.read() as txn, pytest.raises(ValueError):
        txn.log(1).read(start, max_records, max_bytes)


def test_records_roundtrip_byte_identical(store: Store) -> None:
    originals = [
        rec(b"", key=None),
        rec(b"", key=b""),
        rec(b"\x00" * 3, key=b"\x00\xff", timestamp_ms=-5),
        rec(bytes(range(256)) * 4, key=bytes(range(256))),
        rec(
            b"payload",
            headers=(("content-type", b"application/octet-stream"), ("bin", b"\x00\xff\x80")),
        ),
        rec(b"dup", headers=(("h", b"1"), ("h", b""), ("ключ", "значение".encode()))),
        rec(b"idem", idempotency_key="order-42/😀-ünïcode"),
        rec(b"idem-empty", idempotency_key=""),
        rec(b"max-ts", timestamp_ms=2**63 - 1),
    ]
    append(store, 3, originals)
    records = read_all(store, 3)
    assert len(records) == len(originals)
    for offset, (got, want) in enumerate(zip(records, originals, strict=True)):
        assert got == Record(
            offset=offset,
            timestamp_ms=want.timestamp_ms,
            value=want.value,
            key=want.key,
            headers=want.headers,
            idempotency_key=want.idempotency_key,
            size_bytes=len(encode(3, offset, want)),
        )
        assert type(got.value) is bytes
        assert got.key is None or type(got.key) is bytes
    assert records[0].key is None
    assert records[1].key == b""
    assert records[6].idempotency_key == "order-42/😀-ünïcode"
    assert records[7].idempotency_key == ""


# --- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(rec(key=b"k" * (RECORD_KEY_BYTES_MAX + 1)), id="key"),
        pytest.param(rec(b"v" * (RECORD_VALUE_BYTES_MAX + 1)), id="value"),
        pytest.param(rec(headers=(("h", b""),) * (RECORD_HEADERS_MAX + 1)), id="header-count"),
        pytest.param(rec(headers=(("h" * 65536, b""),)), id="header-name"),
        pytest.param(rec(headers=(("\ud800", b""),)), id="header-name-not-utf8"),
        pytest.param(rec(headers=(("h", b"v" * (RECORD_VALUE_BYTES_MAX + 1)),)), id="header-value"),
        pytest.param(rec(idempotency_key="i" * (IDEMPOTENCY_KEY_BYTES_MAX + 1)), id="idem"),
        # 129 two-byte characters: the limit counts utf-8 bytes, not characters.
        pytest.param(rec(idempotency_key="é" * 129), id="idem-utf8-bytes"),
        pytest.param(rec(idempotency_key="\udc00"), id="idem-not-utf8"),
        pytest.param(rec(timestamp_ms=2**63), id="timestamp-high"),
        pytest.param(rec(timestamp_ms=-(2**63) - 1), id="timestamp-low"),
    ],
)
def test_records_over_a_limit_are_rejected_and_the_batch_writes_nothing(
    store: Store, bad: NewRecord
) -> None:
    with store.write() as txn:
        log = txn.log(1)
        with pytest.raises(ValueError):
            log.append([rec(b"fine"), bad])
        # The refused batch left no trace and the transaction is still usable.
        assert log.watermarks() == Watermarks(0, 0)
        assert log.append([rec(b"after")]) == 0
    assert [r.value for r in read_all(store, 1)] == [b"after"]


def test_records_at_the_limits_are_accepted(store: Store) -> None:
    at_limits = [
        rec(b"v" * RECORD_VALUE_BYTES_MAX, key=b"k" * RECORD_KEY_BYTES_MAX),
        rec(headers=tuple((f"h{i}", bytes([i % 256])) for i in range(RECORD_HEADERS_MAX))),
        rec(idempotency_key="é" * (IDEMPOTENCY_KEY_BYTES_MAX // 2)),
        rec(timestamp_ms=-(2**63)),
    ]
    append(store, 1, at_limits)
    records = read_all(store, 1)
    assert [(r.value, r.key, r.headers, r.idempotency_key) for r in records] == [
        (r.value, r.key, r.headers, r.idempotency_key) for r in at_limits
    ]


@pytest.mark.parametrize("log_id", [-1, LOG_ID_MAX + 1])
def test_log_ids_outside_u64_are_rejected(store: Store, log_id: int) -> None:
    with store.write() as txn, pytest.raises(ValueError):
        txn.log(log_id)
    with store.read() as txn, pytest.raises(ValueError):
        txn.log(log_id)


# --- transactions ----------------------------------------------------------------------------


def test_failed_transaction_writes_nothing(store: Store) -> None:
    append(store, 1, [rec(b"a"), rec(b"b"), rec(b"c")])
    append(store, 2, [rec(b"x")])
    with store.write() as txn:
        txn.put(b"k", b"old")
        txn.put(b"gone", b"still here")
    before = (read_all(store, 1), read_all(store, 2), store_kv(store))

    with pytest.raises(Boom), store.write() as txn:
        txn.log(1).append([rec(b"d")])
        txn.log(1).truncate_before(2)
        assert txn.log(2).drop()
        txn.log(3).append([rec(b"new log")])
        txn.put(b"k", b"new")
        txn.put(b"k2", b"added")
        assert txn.delete(b"gone")
        raise Boom

    assert (read_all(store, 1), read_all(store, 2), store_kv(store)) == before
    assert watermarks(store, 1) == Watermarks(0, 3)
    assert watermarks(store, 2) == Watermarks(0, 1)
    assert watermarks(store, 3) == Watermarks(0, 0)
    # The store goes on normally after the abort.
    assert append(store, 1, [rec(b"d")]) == 3


def test_read_transaction_sees_only_committed_state(store: Store) -> None:
    append(store, 1, [rec(b"a")])
    with store.write() as txn:
        txn.log(1).append([rec(b"b")])
        txn.put(b"k", b"v")
    with store.read() as txn:
        assert txn.log(1).watermarks() == Watermarks(0, 2)
        assert txn.get(b"k") == b"v"


def test_read_transaction_never_shows_writes_committed_after_it_began(store: Store) -> None:
    append(store, 1, [rec(b"a")])
    with store.read() as reader:
        with store.write() as txn:
            txn.log(1).append([rec(b"b")])
        # LMDB keeps the reader's snapshot; the memory twin keeps none and must refuse instead.
        try:
            seen = reader.log(1).read(0, 10, 10_000)
        except StorageError:
            assert isinstance(store, MemoryStore)
        else:
            assert [r.value for r in seen] == [b"a"]


def test_read_transaction_opened_during_a_write_never_shows_its_changes(store: Store) -> None:
    append(store, 1, [rec(b"a")])
    with store.write() as txn:
        txn.log(1).append([rec(b"uncommitted")])
        txn.put(b"k", b"uncommitted")
        with store.read() as reader:
            try:
                seen = (reader.log(1).read(0, 10, 10_000), reader.get(b"k"))
            except StorageError:
                assert isinstance(store, MemoryStore)
            else:
                assert ([r.value for r in seen[0]], seen[1]) == ([b"a"], None)
    assert [r.value for r in read_all(store, 1)] == [b"a", b"uncommitted"]


def test_transaction_is_unusable_after_its_block(store: Store) -> None:
    with store.write() as txn:
        log = txn.log(1)
        log.append([rec()])
    with pytest.raises(StorageError):
        log.append([rec()])
    with pytest.raises(StorageError):
        log.watermarks()
    with pytest.raises(StorageError):
        txn.put(b"k", b"v")
    with pytest.raises(StorageError):
        txn.log(2)
    with store.read() as reader:
        reader_log = reader.log(1)
    with pytest.raises(StorageError):
        reader_log.read(0, 1, 100)
    with pytest.raises(StorageError):
        reader.get(b"k")
    assert watermarks(store, 1) == Watermarks(0, 1)


def test_second_write_transaction_in_the_same_thread_is_refused(store: Store) -> None:
    with store.write() as txn:
        txn.log(1).append([rec()])
        with pytest.raises(StorageError), store.write():
            pass
    assert watermarks(store, 1) == Watermarks(0, 1)


def test_store_full_aborts_the_whole_transaction(make_store: StoreFactory) -> None:
    store = make_store(1 * MiB)
    append(store, 1, [rec(b"kept")])
    with pytest.raises(StorageFullError), store.write() as txn:
        txn.put(b"k", b"v")
        txn.log(2).append([rec(b"small")])
        for _ in range(64):
            txn.log(1).append([rec(b"x" * 32 * 1024)])
    assert read_all(store, 1)[0].value == b"kept"
    assert watermarks(store, 1) == Watermarks(0, 1)
    assert watermarks(store, 2) == Watermarks(0, 0)
    assert store_kv(store) == []
    assert append(store, 1, [rec(b"more")]) == 1


def test_swallowed_store_full_error_still_aborts(make_store: StoreFactory) -> None:
    store = make_store(1 * MiB)
    with pytest.raises(StorageFullError), store.write() as txn:
        txn.put(b"k", b"v")
        try:
            txn.log(1).append([rec(b"x" * 2 * MiB)])
        except StorageFullError:
            pass
        # The transaction is dead: nothing more may happen in it.
        with pytest.raises(StorageError):
            txn.put(b"k2", b"v")
    assert store_kv(store) == []
    assert watermarks(store, 1) == Watermarks(0, 0)


def test_closed_store_refuses_transactions(store: Store) -> None:
    store.close()
    with pytest.raises(StorageError), store.write():
        pass
    with pytest.raises(StorageError), store.read():
        pass
    store.close()  # closing twice is harmless


def test_stat_grows_with_stored_data(store: Store) -> None:
    before = store.stat()
    append(store, 1, [rec(b"x" * 1000) for _ in range(200)])
    after = store.stat()
    assert after.used_bytes >= before.used_bytes + 200 * 1000
    assert after.file_bytes == 0 or after.file_bytes >= after.used_bytes


# --- timestamps --------------------------------------------------------------------------------


def test_offset_for_timestamp_finds_first_at_or_after(store: Store) -> None:
    stamps = [10, 10, 20, 20, 20, 30, 45]
    append(store, 1, [rec(timestamp_ms=t) for t in stamps])
    with store.read() as txn:
        log = txn.log(1)
        for wanted in range(0, 50):
            expected = next((i for i, t in enumerate(stamps) if t >= wanted), len(stamps))
            assert log.offset_for_timestamp(wanted) == expected, wanted


def test_offset_for_timestamp_searches_only_from_low(store: Store) -> None:
    append(store, 1, [rec(timestamp_ms=t) for t in (10, 20, 30, 40)])
    with store.write() as txn:
        txn.log(1).truncate_before(2)
    with store.read() as txn:
        assert txn.log(1).offset_for_timestamp(0) == 2
        assert txn.log(1).offset_for_timestamp(40) == 3
        assert txn.log(1).offset_for_timestamp(41) == 4
    with store.write() as txn:
        txn.log(1).truncate_before(4)
    with store.read() as txn:
        assert txn.log(1).offset_for_timestamp(0) == 4


# --- truncation and drop ---------------------------------------------------------------------


def test_truncate_before_moves_low_watermark_and_reclaims_bytes(store: Store) -> None:
    append(store, 1, [rec(b"x" * n) for n in (10, 200, 3000, 5, 70)])
    sizes = [r.size_bytes for r in read_all(store, 1)]
    with store.write() as txn:
        result = txn.log(1).truncate_before(3)
        assert result.removed_records == 3
        assert result.removed_bytes == sum(sizes[:3])
        assert result.low == 3
        assert txn.log(1).watermarks() == Watermarks(3, 5)
    assert watermarks(store, 1) == Watermarks(3, 5)
    assert size_bytes(store, 1) == sum(sizes[3:])
    assert [r.offset for r in read_all(store, 1)] == [3, 4]


def test_truncate_before_removes_at_most_max_records(store: Store) -> None:
    append(store, 1, [rec() for _ in range(10)])
    with store.write() as txn:
        assert txn.log(1).truncate_before(8, max_records=3).low == 3
        assert txn.log(1).truncate_before(8, max_records=3).low == 6
        result = txn.log(1).truncate_before(8, max_records=3)
        assert (result.removed_records, result.low) == (2, 8)
    assert watermarks(store, 1) == Watermarks(8, 10)


def test_truncate_at_or_below_low_is_a_no_op(store: Store) -> None:
    append(store, 1, [rec() for _ in range(5)])
    with store.write() as txn:
        txn.log(1).truncate_before(3)
        for offset in (0, 2, 3):
            result = txn.log(1).truncate_before(offset)
            assert (result.removed_records, result.removed_bytes, result.low) == (0, 0, 3)
        empty = txn.log(9).truncate_before(0)
        assert (empty.removed_records, empty.removed_bytes, empty.low) == (0, 0, 0)
    assert watermarks(store, 1) == Watermarks(3, 5)


def test_truncate_to_high_empties_the_log_and_keeps_high(store: Store) -> None:
    append(store, 1, [rec() for _ in range(4)])
    with store.write() as txn:
        assert txn.log(1).truncate_before(4).low == 4
    assert watermarks(store, 1) == Watermarks(4, 4)
    assert size_bytes(store, 1) == 0
    assert read_all(store, 1) == []
    assert append(store, 1, [rec(b"next")]) == 4
    assert [r.offset for r in read_all(store, 1)] == [4]


def test_truncate_above_high_is_rejected(store: Store) -> None:
    append(store, 1, [rec() for _ in range(3)])
    with store.write() as txn:
        with pytest.raises(OffsetOutOfRangeError):
            txn.log(1).truncate_before(4)
        with pytest.raises(OffsetOutOfRangeError):
            txn.log(2).truncate_before(1)
        with pytest.raises(ValueError):
            txn.log(1).truncate_before(-1)
        with pytest.raises(ValueError):
            txn.log(1).truncate_before(1, max_records=0)
        # A refused call changes nothing and does not spoil the transaction.
        txn.put(b"after", b"ok")
    assert watermarks(store, 1) == Watermarks(0, 3)
    assert store_kv(store) == [(b"after", b"ok")]


def test_drop_in_chunks_forgets_log(store: Store) -> None:
    append(store, 1, [rec(bytes([i])) for i in range(10)])
    with store.write() as txn:
        txn.log(1).truncate_before(2)
    with store.write() as txn:
        assert txn.log(1).drop(max_records=3) is False
        assert txn.log(1).watermarks() == Watermarks(5, 10)
    # Between calls the log is a consistent, shorter log.
    assert [r.offset for r in read_all(store, 1)] == [5, 6, 7, 8, 9]
    with store.write() as txn:
        assert txn.log(1).drop(max_records=3) is False
        assert txn.log(1).drop(max_records=3) is True
        assert txn.log(1).watermarks() == Watermarks(0, 0)
        assert txn.log(1).size_bytes() == 0
    assert watermarks(store, 1) == Watermarks(0, 0)
    assert read_all(store, 1) == []
    # A dropped log is forgotten: appending starts again at offset 0.
    assert append(store, 1, [rec(b"reborn")]) == 0
    assert [(r.offset, r.value) for r in read_all(store, 1)] == [(0, b"reborn")]


def test_drop_of_a_log_that_was_never_written_is_done(store: Store) -> None:
    with store.write() as txn:
        assert txn.log(5).drop() is True
        assert txn.log(5).drop(max_records=1) is True


def test_drop_of_an_emptied_log_forgets_its_high(store: Store) -> None:
    append(store, 1, [rec(), rec()])
    with store.write() as txn:
        txn.log(1).truncate_before(2)
        assert txn.log(1).drop(max_records=1) is True
        assert txn.log(1).append([rec()]) == 0


def test_logs_are_independent(store: Store) -> None:
    ids = [0, 1, 2, 2**40, LOG_ID_MAX]
    for round_ in range(3):
        with store.write() as txn:
            for log_id in ids:
                txn.log(log_id).append(
                    [rec(f"{log_id}/{round_}/{i}".encode()) for i in range(log_id % 3 + 1)]
                )
    with store.write() as txn:
        txn.log(1).truncate_before(4)
        assert txn.log(2**40).drop()
    for log_id in ids:
        count = log_id % 3 + 1
        records = read_all(store, log_id)
        if log_id == 2**40:
            assert records == []
            continue
        expected = [f"{log_id}/{r}/{i}".encode() for r in range(3) for i in range(count)]
        low = 4 if log_id == 1 else 0
        assert [r.value for r in records] == expected[low:]
        assert watermarks(store, log_id) == Watermarks(low, 3 * count)
        assert size_bytes(store, log_id) == sum(r.size_bytes for r in records)


# --- key/value table ---------------------------------------------------------------------------


def store_kv(store: Store) -> list[tuple[bytes, bytes]]:
    with store.read() as txn:
        return list(txn.scan(b""))


def test_kv_put_get_delete(store: Store) -> None:
    with store.write() as txn:
        assert txn.get(b"a") is None
        txn.put(b"a", b"1")
        txn.put(b"a", b"2")
        txn.put(b"empty", b"")
        assert txn.get(b"a") == b"2"
        assert txn.delete(b"missing") is False
    with store.read() as txn:
        assert txn.get(b"a") == b"2"
        assert txn.get(b"empty") == b""
    with store.write() as txn:
        assert txn.delete(b"a") is True
        assert txn.get(b"a") is None
    assert store_kv(store) == [(b"empty", b"")]


def test_kv_scan_by_prefix_in_key_order(store: Store) -> None:
    keys = [b"q/2", b"q/10", b"q/1", b"q\xff", b"p/9", b"q/", b"r", b"q/1/x", b"\x00"]
    with store.write() as txn:
        for key in keys:
            txn.put(key, b"v" + key)
    with store.read() as txn:
        assert [k for k, _ in txn.scan(b"q/")] == [b"q/", b"q/1", b"q/1/x", b"q/10", b"q/2"]
        assert [k for k, _ in txn.scan(b"q/", start=b"q/10")] == [b"q/10", b"q/2"]
        assert [k for k, _ in txn.scan(b"q/", start=b"q/11")] == [b"q/2"]
        assert [k for k, _ in txn.scan(b"q/", start=b"q/3")] == []
        assert list(txn.scan(b"zz")) == []
        assert [k for k, _ in txn.scan(b"")] == sorted(keys)
        assert all(v == b"v" + k for k, v in txn.scan(b""))


def test_kv_scan_start_must_begin_with_prefix(store: Store) -> None:
    with store.read() as txn, pytest.raises(ValueError):
        txn.scan(b"q/", start=b"p")


def test_kv_scan_continues_after_changes_made_while_scanning(store: Store) -> None:
    with store.write() as txn:
        for key in (b"k1", b"k2", b"k3"):
            txn.put(key, b"")
    with store.write() as txn:
        seen = []
        for key, _ in txn.scan(b"k"):
            seen.append(key)
            assert txn.delete(key)
            if key == b"k1":
                txn.put(b"k15", b"")  # after the current key: the scan reaches it
                txn.put(b"k0", b"")  # before it: the scan has passed that point
    assert seen == [b"k1", b"k15", b"k2", b"k3"]
    assert store_kv(store) == [(b"k0", b"")]


@pytest.mark.parametrize("key", [b"", b"k" * (KV_KEY_BYTES_MAX + 1)])
def test_kv_keys_outside_the_limits_are_rejected(store: Store, key: bytes) -> None:
    with store.write() as txn:
        with pytest.raises(ValueError):
            txn.put(key, b"v")
        with pytest.raises(ValueError):
            txn.get(key)
        with pytest.raises(ValueError):
            txn.delete(key)
        txn.put(b"k" * KV_KEY_BYTES_MAX, b"longest key")
    assert store_kv(store) == [(b"k" * KV_KEY_BYTES_MAX, b"longest key")]


# --- the twin agrees with LMDB ---------------------------------------------------------------


class _Abort(Exception):
    pass


Outcome = tuple[str, object]


def _outcome(op: Callable[[], object]) -> Outcome:
    try:
        return ("ok", op())
    except (StorageError, ValueError) as e:
        return ("raised", type(e).__name__)


def _random_records(rng: random.Random, clock: list[int], count: int) -> list[NewRecord]:
    records = []
    for _ in range(count):
        clock[0] += rng.choice((0, 0, 1, 5))
        key = rng.choice((None, b"", rng.randbytes(rng.randint(1, 20))))
        headers = tuple(
            (rng.choice(("a", "b", "ü")), rng.randbytes(rng.randint(0, 8)))
            for _ in range(rng.choice((0, 0, 0, 1, 3)))
        )
        idem = rng.choice((None, None, "", f"id-{rng.randint(0, 99)}"))
        value = rng.randbytes(rng.choice((0, 1, 50, 300, 2000)))
        records.append(NewRecord(clock[0], value, key, headers, idem))
    return records


def _random_op(
    rng: random.Random, model: PartitionLog, clock: list[int]
) -> Callable[[PartitionLog], object]:
    """One operation on a log, with arguments drawn near the model log's current watermarks."""
    low, high = model.watermarks().low, model.watermarks().high
    kind = rng.choice(("append", "append", "append", "truncate", "read", "read", "ts", "drop"))
    if kind == "append":
        records = _random_records(rng, clock, rng.randint(0, 6))
        return lambda log: log.append(records)
    if kind == "truncate":
        offset = rng.randint(max(0, low - 1), high + 1)
        chunk = rng.choice((None, 1, 2, 5))
        return lambda log: log.truncate_before(offset, chunk)
    if kind == "read":
        start = rng.randint(0, high + 1)
        max_records = rng.randint(0, 8)
        max_bytes = rng.choice((0, 100, 1000, 10_000))
        return lambda log: log.read(start, max_records, max_bytes)
    if kind == "ts":
        stamp = rng.randint(clock[0] - 40, clock[0] + 2)
        return lambda log: log.offset_for_timestamp(stamp)
    chunk = rng.choice((None, 1, 3, 100))
    return lambda log: log.drop(chunk)


def _kv_op(txn: WriteTxn, kind: str, key: bytes, value: bytes) -> object:
    if kind == "put":
        txn.put(key, value)
        return None
    if kind == "delete":
        return txn.delete(key)
    return txn.get(key)


def _snapshot(store: Store, log_ids: list[int]) -> object:
    with store.read() as txn:
        logs = [
            (txn.log(i).watermarks(), txn.log(i).size_bytes(), txn.log(i).read(0, 10**6, 2**62))
            for i in log_ids
        ]
        return logs, list(txn.scan(b""))


@pytest.mark.parametrize("seed", range(12))
def test_lmdb_and_memory_agree_on_random_operations(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    lmdb_store = LmdbStore(str(tmp_path / "lmdb"), map_size_bytes=256 * MiB, sync=False)
    memory_store = MemoryStore()
    # The highest id makes LMDB mix appends at the end of its table with appends inside it.
    log_ids = [0, 1, 7, LOG_ID_MAX]
    clocks = {log_id: [rng.randint(0, 1000)] for log_id in log_ids}
    try:
        for txn_number in range(60):
            abort = rng.random() < 0.2
            try:
                with lmdb_store.write() as on_lmdb, memory_store.write() as on_memory:
                    for step in range(rng.randint(1, 8)):
                        where = f"seed={seed} txn={txn_number} step={step}"
                        if rng.random() < 0.25:
                            key = rng.choice((b"a", b"a/1", b"a/2", b"b", b"b/x"))
                            value = rng.randbytes(rng.randint(0, 30))
                            kind = rng.choice(("put", "put", "delete", "get"))
                            got, want = (
                                _outcome(functools.partial(_kv_op, txn, kind, key, value))
                                for txn in (on_lmdb, on_memory)
                            )
                            assert got == want, f"{where} {kind} {key!r}: {got} != {want}"
                            continue
                        log_id = rng.choice(log_ids)
                        op = _random_op(rng, on_memory.log(log_id), clocks[log_id])
                        got = _outcome(functools.partial(op, on_lmdb.log(log_id)))
                        want = _outcome(functools.partial(op, on_memory.log(log_id)))
                        assert got == want, f"{where} log={log_id}: lmdb {got} != memory {want}"
                    if abort:
                        raise _Abort
            except _Abort:
                pass
            assert _snapshot(lmdb_store, log_ids) == _snapshot(memory_store, log_ids), (
                f"seed={seed}: stores differ after txn {txn_number} (aborted={abort})"
            )
    finally:
        lmdb_store.close()
        memory_store.close()


def test_prepared_records_are_stored_like_appended_ones(store: Store) -> None:
    from storage.codec import prepare

    originals = [
        NewRecord(777, b"v1"),
        NewRecord(777, b"", key=b"", headers=(("a", b"\x00"), ("b", b"")), idempotency_key="i"),
        NewRecord(777, b"x" * 3000, key=b"k", idempotency_key="\u00e9t\u00e9"),
    ]
    prepared = [prepare(r.value, r.key, r.headers, r.idempotency_key) for r in originals]
    with store.write() as txn:
        assert txn.log(1).append(originals) == 0
        assert txn.log(2).append_prepared(777, prepared) == 0
    a, b = read_all(store, 1), read_all(store, 2)
    assert a == b
    assert size_bytes(store, 1) == size_bytes(store, 2)


def test_malformed_prepared_record_is_refused_and_writes_nothing(store: Store) -> None:
    from storage.codec import prepare

    good = prepare(b"good")
    for bad in (b"", b"\x02" + good[1:], good[:-1]):
        with pytest.raises(ValueError), store.write() as txn:
            txn.log(3).append_prepared(1, [good, bad])
        assert watermarks(store, 3) == Watermarks(0, 0)
