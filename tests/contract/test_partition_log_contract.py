"""The storage contract (storage/api.py), checked against every implementation.

Every test runs on LmdbStore and on MemoryStore; one also drives both with the same random
operations and requires identical answers, so the twin stays a faithful stand-in.

A log stores record batches (``storage.record_batch``): one batch per append, truncation points
inside batches, sizes counted in whole stored batches.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import (
    CorruptRecordError,
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
    record_batch,
)
from storage.api import (
    IDEMPOTENCY_KEY_BYTES_MAX,
    LOG_ID_MAX,
    RECORD_HEADERS_MAX,
    RECORD_KEY_BYTES_MAX,
    RECORD_VALUE_BYTES_MAX,
)
from storage.codec import KV_KEY_BYTES_MAX, position
from storage.record_batch import BatchHeader, CorruptBatchError

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


def headers(store: Store, log_id: int, start_offset: int = 0) -> list[BatchHeader]:
    with store.read() as txn:
        return txn.log(log_id).batch_headers(start_offset, 2**32)


def share(log_id: int, record: NewRecord) -> int:
    """A record's ``size_bytes``: its share of a batch's records section (the same at any
    offset, since only the deltas in its fixed head depend on where it sits)."""
    return len(record_batch.encode(log_id, 0, [record])) - record_batch.HEADER_SIZE


def lmdb_batch_rows(store: LmdbStore) -> int:
    """Rows of the ``batches`` database, read straight from LMDB."""
    env = store._env
    with env.begin() as txn:
        entries: int = txn.stat(env.open_db(b"batches", txn=txn, create=False))["entries"]
    return entries


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


def test_size_bytes_counts_whole_stored_batches(store: Store) -> None:
    first = [rec(b"x" * n, key=b"k" * n) for n in (0, 1, 100, 5000)]
    second = [rec(b"y" * 7)]
    append(store, 1, first)
    append(store, 1, second)
    stored = [record_batch.encode(1, 0, first), record_batch.encode(1, 4, second)]
    assert size_bytes(store, 1) == sum(map(len, stored))
    assert [h.size_bytes for h in headers(store, 1)] == [len(b) for b in stored]
    records = read_all(store, 1)
    # Records count their share of the records section; each batch adds its header once.
    assert size_bytes(store, 1) == sum(r.size_bytes for r in records) + 2 * (
        record_batch.HEADER_SIZE
    )
    for r, want in zip(records, first + second, strict=True):
        assert r.size_bytes == share(1, want)


def test_each_append_stores_one_batch_at_high(store: Store) -> None:
    with store.write() as txn:
        assert txn.log(1).append([rec(bytes([i])) for i in range(5)]) == 0
        assert txn.log(1).append([rec(b"x")]) == 5
    assert append(store, 1, [rec(b"y"), rec(b"z")]) == 6
    got = headers(store, 1)
    assert [(h.base_offset, h.count) for h in got] == [(0, 5), (5, 1), (6, 2)]
    assert [h.last_offset for h in got] == [4, 5, 7]
    # A plain append is no producer session.
    assert {(h.producer_id, h.producer_epoch, h.first_sequence) for h in got} == {(0, 0, 0)}
    if isinstance(store, LmdbStore):
        assert lmdb_batch_rows(store) == 3
    else:
        assert isinstance(store, MemoryStore)
        assert store._logs[1].bases == [0, 5, 6]


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


def test_read_from_the_middle_of_a_batch_and_across_batches(store: Store) -> None:
    append(store, 1, [rec(bytes([i]), timestamp_ms=i) for i in range(5)])
    append(store, 1, [rec(bytes([i]), timestamp_ms=i) for i in range(5, 8)])
    append(store, 1, [rec(bytes([i]), timestamp_ms=i) for i in range(8, 12)])
    with store.read() as txn:
        log = txn.log(1)
        assert [(r.offset, r.value, r.timestamp_ms) for r in log.read(3, 1, 10_000)] == [
            (3, b"\x03", 3)
        ]
        assert [r.offset for r in log.read(3, 4, 10_000)] == [3, 4, 5, 6]
        assert [r.offset for r in log.read(6, 100, 10_000)] == [6, 7, 8, 9, 10, 11]
        assert [r.value for r in log.read(9, 2, 10_000)] == [b"\x09", b"\x0a"]
        # The byte limit counts each record's share, not the batches it comes from.
        one = log.read(0, 1, 10_000)[0].size_bytes
        assert [r.offset for r in log.read(4, 100, 3 * one)] == [4, 5, 6]
        assert [r.offset for r in log.read(4, 100, 3 * one - 1)] == [4, 5]


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
    # Timestamps go down between some of these, which one batch refuses: one batch each.
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
    with store.write() as txn:
        for original in originals:
            txn.log(3).append([original])
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
            size_bytes=share(3, want),
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


@pytest.mark.parametrize("timestamp_ms", [2**63, -(2**63) - 1])
def test_timestamps_outside_i64_are_rejected_and_write_nothing(
    store: Store, timestamp_ms: int
) -> None:
    with store.write() as txn:
        log = txn.log(1)
        with pytest.raises(ValueError, match="signed 64-bit"):
            log.append([rec(timestamp_ms=timestamp_ms)])
        with pytest.raises(ValueError, match="signed 64-bit"):
            log.append_batch(
                timestamp_ms, 1, record_batch.prepare_records([(b"v", None, (), None)])
            )
        assert log.watermarks() == Watermarks(0, 0)
    assert headers(store, 1) == []


def test_decreasing_timestamps_in_one_append_are_rejected_and_write_nothing(
    store: Store,
) -> None:
    append(store, 1, [rec(b"before", timestamp_ms=50)])
    with store.write() as txn:
        log = txn.log(1)
        with pytest.raises(ValueError, match="never decrease"):
            log.append([rec(b"a", timestamp_ms=100), rec(b"b", timestamp_ms=99)])
        assert log.watermarks() == Watermarks(0, 1)
        # Equal stamps are fine, and each record keeps its own.
        assert log.append([rec(b"c", timestamp_ms=100), rec(b"d", timestamp_ms=100)]) == 1
        assert log.append([rec(b"e", timestamp_ms=101), rec(b"f", timestamp_ms=7_000)]) == 3
    got = read_all(store, 1)
    assert [(r.value, r.timestamp_ms) for r in got] == [
        (b"before", 50), (b"c", 100), (b"d", 100), (b"e", 101), (b"f", 7_000)
    ]  # fmt: skip
    assert [(h.first_timestamp_ms, h.last_timestamp_ms) for h in headers(store, 1)] == [
        (50, 50), (100, 100), (101, 7_000)
    ]  # fmt: skip


def test_records_at_the_limits_are_accepted(store: Store) -> None:
    at_limits = [
        rec(b"v" * RECORD_VALUE_BYTES_MAX, key=b"k" * RECORD_KEY_BYTES_MAX),
        rec(headers=tuple((f"h{i}", bytes([i % 256])) for i in range(RECORD_HEADERS_MAX))),
        rec(idempotency_key="é" * (IDEMPOTENCY_KEY_BYTES_MAX // 2)),
    ]
    append(store, 1, at_limits)
    # Below every other stamp, so in a batch of its own (the log does not order batches).
    at_limits.append(rec(timestamp_ms=-(2**63)))
    append(store, 1, at_limits[-1:])
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


def test_truncate_before_moves_low_watermark_and_reclaims_whole_batches(store: Store) -> None:
    for n in (10, 200, 3000, 5, 70):
        append(store, 1, [rec(b"x" * n)])
    sizes = [h.size_bytes for h in headers(store, 1)]
    with store.write() as txn:
        result = txn.log(1).truncate_before(3)
        assert result.removed_records == 3
        assert result.removed_bytes == sum(sizes[:3])
        assert result.low == 3
        assert txn.log(1).watermarks() == Watermarks(3, 5)
    assert watermarks(store, 1) == Watermarks(3, 5)
    assert size_bytes(store, 1) == sum(sizes[3:])
    assert [r.offset for r in read_all(store, 1)] == [3, 4]
    assert [h.base_offset for h in headers(store, 1)] == [3, 4]


def test_truncate_inside_a_batch_keeps_it_readable_from_low_until_all_is_below_low(
    store: Store,
) -> None:
    append(store, 1, [rec(bytes([i])) for i in range(4)])  # [0, 3]
    append(store, 1, [rec(bytes([i])) for i in range(4, 10)])  # [4, 9]
    first, second = (h.size_bytes for h in headers(store, 1))
    with store.write() as txn:
        result = txn.log(1).truncate_before(2)
    # Inside the first batch: nothing is deleted, the records below low are gone for readers.
    assert (result.removed_records, result.removed_bytes, result.low) == (2, 0, 2)
    assert size_bytes(store, 1) == first + second
    assert [r.offset for r in read_all(store, 1)] == [2, 3, 4, 5, 6, 7, 8, 9]
    with store.read() as txn:
        assert [r.value for r in txn.log(1).read(0, 1, 10_000)] == [b"\x02"]
        # The first header still tells the batch's own base: it begins below low.
        assert [(h.base_offset, h.count) for h in txn.log(1).batch_headers(0, 1)] == [(0, 4)]
    with store.write() as txn:
        result = txn.log(1).truncate_before(6)
    # The first batch is all below low now: deleted; the second holds 6 and stays.
    assert (result.removed_records, result.removed_bytes, result.low) == (4, first, 6)
    assert size_bytes(store, 1) == second
    assert [r.offset for r in read_all(store, 1)] == [6, 7, 8, 9]
    assert [h.base_offset for h in headers(store, 1)] == [4]
    with store.write() as txn:
        result = txn.log(1).truncate_before(10)
    assert (result.removed_records, result.removed_bytes, result.low) == (4, second, 10)
    assert (size_bytes(store, 1), headers(store, 1), read_all(store, 1)) == (0, [], [])
    assert watermarks(store, 1) == Watermarks(10, 10)


def test_retention_truncates_with_max_records_across_batches(store: Store) -> None:
    for base, count in ((0, 3), (3, 4), (7, 2), (9, 5)):
        append(store, 1, [rec(f"{base + i}".encode()) for i in range(count)])
    sizes = {h.base_offset: h.size_bytes for h in headers(store, 1)}
    seen = []
    with store.write() as txn:
        log = txn.log(1)
        while log.watermarks().low < 12:
            result = log.truncate_before(12, max_records=4)
            seen.append((result.removed_records, result.removed_bytes, result.low))
    # Each call removes at most 4 records; a batch goes with the call that passes its end.
    assert seen == [
        (4, sizes[0], 4),
        (4, sizes[3], 8),
        (4, sizes[7], 12),
    ]
    assert [h.base_offset for h in headers(store, 1)] == [9]
    assert size_bytes(store, 1) == sizes[9]
    assert [r.value for r in read_all(store, 1)] == [b"12", b"13"]


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


def test_drop_in_chunks_smaller_than_a_batch_makes_progress_and_ends(store: Store) -> None:
    append(store, 1, [rec(b"a"), rec(b"b")])  # [0, 1]
    append(store, 1, [rec(bytes([i])) for i in range(10)])  # [2, 11]: bigger than a chunk
    append(store, 1, [rec(b"z")])  # [12, 12]
    calls = []
    done = False
    while not done:
        assert len(calls) < 20, "drop made no progress"
        with store.write() as txn:
            done = txn.log(1).drop(max_records=3)
            marks = txn.log(1).watermarks()
        calls.append((done, marks))
        # Between calls the log is a consistent, shorter log.
        assert [r.offset for r in read_all(store, 1)] == list(range(marks.low, marks.high))
    assert calls == [
        (False, Watermarks(3, 13)),
        (False, Watermarks(6, 13)),
        (False, Watermarks(9, 13)),
        (False, Watermarks(12, 13)),
        (True, Watermarks(0, 0)),
    ]
    assert (size_bytes(store, 1), headers(store, 1)) == (0, [])
    if isinstance(store, LmdbStore):
        assert lmdb_batch_rows(store) == 0
    assert append(store, 1, [rec(b"reborn")]) == 0


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
        assert size_bytes(store, log_id) == sum(h.size_bytes for h in headers(store, log_id))


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
    kind = rng.choice(
        ("append", "append", "batch", "truncate", "read", "read", "ts", "headers", "drop")
    )
    if kind == "append":
        records = _random_records(rng, clock, rng.randint(0, 6))
        return lambda log: log.append(records)
    if kind == "batch":
        fields = [
            (r.value, r.key, r.headers, r.idempotency_key)
            for r in _random_records(rng, clock, rng.randint(1, 6))
        ]
        section = record_batch.prepare_records(fields)
        count = len(fields)
        producer = rng.choice(((0, 0, 0), (rng.randint(1, 2**64 - 1), rng.randint(0, 9), 5)))
        stamp = clock[0]
        return lambda log: log.append_batch(stamp, count, section, *producer)
    if kind == "headers":
        start = rng.randint(0, high + 1)
        max_batches = rng.randint(0, 4)
        if rng.random() < 0.5:
            return lambda log: log.batch_headers(start, max_batches)
        max_bytes = rng.choice((0, 300, 3000, 100_000))
        return lambda log: log.read_batches(start, max_batches, max_bytes)
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
            assert lmdb_store.digest() == memory_store.digest(), f"seed={seed} txn={txn_number}"
    finally:
        lmdb_store.close()
        memory_store.close()


def test_append_batch_round_trips_records_stamped_with_its_timestamp(store: Store) -> None:
    originals = [
        NewRecord(777, b"v1"),
        NewRecord(777, b"", key=b"", headers=(("a", b"\x00"), ("b", b"")), idempotency_key="i"),
        NewRecord(777, b"x" * 3000, key=b"k", idempotency_key="\u00e9t\u00e9"),
    ]
    section = record_batch.prepare_records(
        [(r.value, r.key, r.headers, r.idempotency_key) for r in originals]
    )
    with store.write() as txn:
        assert txn.log(1).append(originals) == 0
        assert txn.log(2).append([rec(b"first")]) == 0
        assert txn.log(2).append_batch(777, 3, section, 42, 7, 1_000) == 1
        assert txn.log(2).append_batch(778, 3, section) == 4
        assert txn.log(2).watermarks() == Watermarks(0, 7)
    got = read_all(store, 2)
    assert got[1:4] == [
        Record(offset, r.timestamp_ms, r.value, r.key, r.headers, r.idempotency_key, share(2, r))
        for offset, r in enumerate(originals, 1)
    ]
    assert [(r.offset, r.timestamp_ms) for r in got[4:]] == [(4, 778), (5, 778), (6, 778)]
    # The same records stamped once, or one by one with the same stamp: the same batch.
    assert headers(store, 1)[0].size_bytes == headers(store, 2)[1].size_bytes
    assert [r.value for r in read_all(store, 1)] == [r.value for r in got[1:4]]
    assert [
        (
            h.base_offset,
            h.count,
            h.first_timestamp_ms,
            h.last_timestamp_ms,
            h.producer_id,
            h.producer_epoch,
            h.first_sequence,
        )
        for h in headers(store, 2)
    ] == [(0, 1, 1_000, 1_000, 0, 0, 0), (1, 3, 777, 777, 42, 7, 1_000), (4, 3, 778, 778, 0, 0, 0)]
    with store.read() as txn:
        # From the middle of a batch: the header of the batch holding the offset.
        assert [h.base_offset for h in txn.log(2).batch_headers(5, 5)] == [4]
        assert [h.base_offset for h in txn.log(2).batch_headers(2, 1)] == [1]
        assert txn.log(2).batch_headers(7, 5) == []
        with pytest.raises(ValueError, match="max_batches"):
            txn.log(2).batch_headers(0, 0)


@pytest.mark.parametrize(
    ("count", "fields", "problem"),
    [
        pytest.param(0, (0, 0, 0), "count 0", id="count-zero"),
        pytest.param(3, (0, 0, 0), "cannot hold 3 records", id="section-too-short"),
        pytest.param(1, (-1, 0, 0), "producer_id", id="producer-id"),
        pytest.param(1, (0, 2**32, 0), "producer_epoch", id="producer-epoch"),
        pytest.param(1, (0, 0, 2**64), "first_sequence", id="first-sequence"),
    ],
)
def test_append_batch_with_header_fields_out_of_range_is_refused_and_writes_nothing(
    store: Store, count: int, fields: tuple[int, int, int], problem: str
) -> None:
    section = record_batch.prepare_records([(b"v", None, (), None)])
    with store.write() as txn:
        log = txn.log(3)
        with pytest.raises(ValueError, match=problem):
            log.append_batch(1, count, section, *fields)
        assert log.watermarks() == Watermarks(0, 0)
        # The refusal did not spoil the transaction.
        assert log.append_batch(1, 1, section) == 0
    assert [r.value for r in read_all(store, 3)] == [b"v"]


def test_append_batch_whose_section_does_not_hold_its_count_fails_on_read(store: Store) -> None:
    # Room for two record heads, but only one record in it: seal cannot tell without walking.
    section = record_batch.prepare_records([(b"x" * 40, None, (), None)])
    with store.write() as txn:
        assert txn.log(3).append_batch(1, 2, section) == 0
    with store.read() as txn, pytest.raises(CorruptRecordError) as caught:
        txn.log(3).read(0, 10, 10_000)
    assert caught.value.log_id == 3
    assert caught.value.offset in (0, 1)


def test_read_batches_returns_whole_stored_batches_from_the_one_holding_start(
    store: Store,
) -> None:
    batches = [[rec(bytes([i]) * 10) for i in range(b, b + n)] for b, n in ((0, 4), (4, 3), (7, 5))]
    for records in batches:
        append(store, 1, records)
    stored = [
        record_batch.encode(1, base, records)
        for base, records in zip((0, 4, 7), batches, strict=True)
    ]
    with store.write() as txn:
        txn.log(1).truncate_before(2)
    with store.read() as txn:
        log = txn.log(1)

        def bases(start: int, max_records: int, max_bytes: int = 2**40) -> list[int]:
            return [b.base_offset for b in log.read_batches(start, max_records, max_bytes)]

        got = log.read_batches(0, 100, 2**40)
        # As stored, byte for byte, the first one beginning below low; counts from the header.
        assert [(b.base_offset, b.count, b.data) for b in got] == [
            (0, 4, stored[0]),
            (4, 3, stored[1]),
            (7, 5, stored[2]),
        ]
        assert [r.offset for r in record_batch.decode(1, 0, got[0].data, 2)] == [2, 3]
        # Enough batches to hold max_records records from the start (low here), no more.
        assert bases(0, 2) == [0]
        assert bases(0, 3) == [0, 4]
        assert bases(5, 2) == [4]
        assert bases(5, 3) == [4, 7]
        assert bases(11, 100) == [7]
        assert bases(12, 100) == []
        # The byte limit counts whole batches, and one comes back even when it is larger.
        assert bases(0, 100, len(stored[0]) + len(stored[1])) == [0, 4]
        assert bases(0, 100, len(stored[0]) + len(stored[1]) - 1) == [0]
        assert bases(4, 100, 0) == [4]
        with pytest.raises(ValueError):
            log.read_batches(0, 0, 100)
        with pytest.raises(ValueError):
            log.read_batches(0, 1, -1)


def test_read_batches_hands_a_damaged_batch_on_for_the_reader_to_check(store: Store) -> None:
    append(store, 1, [rec(b"a" * 30), rec(b"b" * 30)])
    damage_batch(store, 1, 0, record_batch.HEADER_SIZE + 25)
    with store.read() as txn:
        (got,) = txn.log(1).read_batches(0, 10, 2**20)
    assert (got.base_offset, got.count) == (0, 2)
    with pytest.raises(CorruptBatchError) as caught:
        record_batch.decode(1, 0, got.data)
    assert (caught.value.first_offset, caught.value.last_offset) == (0, 1)


def test_read_batches_refuses_a_header_whose_count_overlaps_the_next_batch(store: Store) -> None:
    append(store, 1, [rec(b"a" * 30), rec(b"b" * 30)])  # [0, 1]
    append(store, 1, [rec(b"c" * 30), rec(b"d" * 30)])  # [2, 3]
    # The low byte of the first header's count: 2 becomes 3, claiming offset 2 twice. The crc
    # would catch it, but read_batches leaves the crc to the reader: the tiling must not.
    damage_batch(store, 1, 0, 10)
    with store.read() as txn, pytest.raises(CorruptRecordError):
        txn.log(1).read_batches(0, 10, 2**20)


# --- damage ------------------------------------------------------------------------------------


def damage_batch(store: Store, log_id: int, base_offset: int, at: int) -> None:
    """Flip one byte of a stored batch behind the store's back: a raw LMDB write of its row, or
    the twin's stored bytes."""
    if isinstance(store, LmdbStore):
        env = store._env
        with env.begin(write=True) as txn:
            db = env.open_db(b"batches", txn=txn, create=False)
            stored = txn.get(position(log_id, base_offset), db=db)
            assert stored is not None
            damaged = bytearray(stored)
            damaged[at] ^= 0x01
            txn.put(position(log_id, base_offset), bytes(damaged), db=db)
        return
    assert isinstance(store, MemoryStore)
    state = store._logs[log_id]
    index = state.bases.index(base_offset)
    damaged = bytearray(state.batches[index])
    damaged[at] ^= 0x01
    state.batches[index] = bytes(damaged)


def test_flipped_byte_inside_a_batch_is_refused_at_the_batch_offsets(store: Store) -> None:
    append(store, 1, [rec(bytes([i]) * 20) for i in range(4)])  # [0, 3]
    append(store, 1, [rec(bytes([i]) * 20, timestamp_ms=2_000) for i in range(4, 7)])  # [4, 6]
    append(store, 1, [rec(bytes([i]) * 20, timestamp_ms=3_000) for i in range(7, 10)])  # [7, 9]
    damage_batch(store, 1, 4, record_batch.HEADER_SIZE + 50)  # a value byte of record 5
    with store.read() as txn:
        log = txn.log(1)
        for start in (4, 5, 6, 0):
            with pytest.raises(CorruptBatchError) as caught:
                log.read(start, 10, 10_000)
            error = caught.value
            assert (error.log_id, error.first_offset, error.last_offset) == (1, 4, 6), start
            assert error.offset == 4
            assert "crc32c" in str(error)
        with pytest.raises(CorruptBatchError):
            log.batch_headers(4, 1)
        with pytest.raises(CorruptBatchError):
            log.offset_for_timestamp(2_000)
        # The batches around it are intact and still read.
        assert [r.offset for r in log.read(0, 4, 10_000)] == [0, 1, 2, 3]
        assert [r.offset for r in log.read(7, 10, 10_000)] == [7, 8, 9]
        assert [h.base_offset for h in log.batch_headers(7, 10)] == [7]
    with pytest.raises(CorruptRecordError):
        store.digest()


def test_flipped_byte_makes_the_copy_refused(store: Store, tmp_path: Path) -> None:
    append(store, 1, [rec(b"a" * 30), rec(b"b" * 30)])
    append(store, 1, [rec(b"c" * 30)])
    damage_batch(store, 1, 0, record_batch.HEADER_SIZE + 25)
    try:
        store.copy_to(str(tmp_path / "copy"))
    except StorageError:
        return  # refusing to copy damage is as good as refusing it when reading the copy
    target = (
        MemoryStore()
        if isinstance(store, MemoryStore)
        else LmdbStore(str(tmp_path / "target"), map_size_bytes=64 * MiB, sync=False)
    )
    try:
        with pytest.raises(StorageError, match="crc32c"):
            target.replace_from(str(tmp_path / "copy"))
        assert watermarks(target, 1) == Watermarks(0, 0)
    finally:
        target.close()


# --- time --------------------------------------------------------------------------------------


def test_offset_for_timestamp_across_batches_with_distinct_timestamps(store: Store) -> None:
    batches = [[10, 10, 12], [12, 15], [20], [21, 25, 25, 30]]
    stamps = [t for batch in batches for t in batch]
    for batch in batches:
        append(store, 1, [rec(timestamp_ms=t) for t in batch])
    with store.read() as txn:
        log = txn.log(1)
        for wanted in range(0, 35):
            expected = next((i for i, t in enumerate(stamps) if t >= wanted), len(stamps))
            assert log.offset_for_timestamp(wanted) == expected, wanted
    with store.write() as txn:
        txn.log(1).truncate_before(4)  # inside [3, 4]: 15 at 4 is the first readable
    with store.read() as txn:
        log = txn.log(1)
        assert [log.offset_for_timestamp(t) for t in (0, 12, 15, 16, 21, 26, 31)] == [
            4, 4, 4, 5, 6, 9, 10
        ]  # fmt: skip
