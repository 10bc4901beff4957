"""The records table over the record-batch layout, without Spark or a broker: a store written
by ``LmdbStore`` (tests/audit/data.py ``build_batch_store``) and damaged by
tests/audit/inject.py, read through ``storage.lmdb_inspect`` and ``fluxmq.audit.tables``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb
import pytest

from fluxmq.audit import layout, tables
from storage import record_batch
from storage.api import NewRecord, OldFormatError
from storage.codec import position
from storage.lmdb_inspect import LmdbInspector
from tests.audit import inject
from tests.audit.data import STORE_BATCHES, STORE_QUEUE, STORE_T0_MS, build_batch_store

HIGH = sum(STORE_BATCHES)
ALL = [n for n, _ in tables.RECORDS]
Row = dict[str, Any]


def _rows(data_dir: Path, split_records: int = 1_000_000, names: list[str] = ALL) -> list[Row]:
    (store,) = layout.discover([str(data_dir)])
    rows: list[Row] = []
    with LmdbInspector(store.path) as ins, ins.view() as view:
        for split in tables.splits(store, view, split_records):
            for batch in tables.read_split(split, view, names):
                rows.extend(batch.to_pylist())
    return rows


def _logs(data_dir: Path) -> list[Row]:
    (store,) = layout.discover([str(data_dir)])
    with LmdbInspector(store.path) as ins, ins.view() as view:
        return [
            r
            for b in tables.read_logs(store, view, [n for n, _ in tables.LOGS])
            for r in b.to_pylist()
        ]


def _stored_crc(data_dir: Path, base: int) -> int:
    lid = inject.log_id(data_dir, STORE_QUEUE, 0)
    with inject._env(data_dir) as (txn, batches, _kv):
        raw = bytes(txn.get(position(lid, base), db=batches))
    return int.from_bytes(raw[:4], "big")


def test_every_record_of_every_batch_is_one_row_with_its_share_and_its_batch_crc(
    tmp_path: Path,
) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    rows = _rows(d)
    assert [r["offset"] for r in rows] == list(range(HIGH))
    assert all(r["crc_ok"] and r["error"] is None for r in rows)
    assert [r["value"] for r in rows] == [b"value-%d" % i for i in range(HIGH)]
    assert [r["headers"] for r in rows] == [[("h", b"%d" % i)] for i in range(HIGH)]
    assert [r["timestamp_ms"] for r in rows] == [STORE_T0_MS + i for i in range(HIGH)]
    assert [r["ts_prev"] for r in rows] == [None, *(STORE_T0_MS + i for i in range(HIGH - 1))]
    # Every record of a batch carries that batch's stored crc; the shares add up to the
    # records sections, the headers being counted once per batch.
    base = 0
    stored = 0
    for size in STORE_BATCHES:
        crcs = {r["crc"] for r in rows[base : base + size]}
        assert crcs == {_stored_crc(d, base)}
        stored += sum(r["size_bytes"] for r in rows[base : base + size]) + record_batch.HEADER_SIZE
        base += size
    (log,) = _logs(d)
    assert log["size_bytes"] == stored


@pytest.mark.parametrize("split_records", [1, 2, 3, 4, 7, 1000])
def test_splits_cut_at_batch_boundaries_so_no_record_is_lost_or_read_twice(
    tmp_path: Path, split_records: int
) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    rows = _rows(d, split_records, ["offset", "timestamp_ms", "ts_prev"])
    assert [r["offset"] for r in rows] == list(range(HIGH))
    # ts_prev crosses split boundaries, which fall inside batches for most sizes.
    assert [r["ts_prev"] for r in rows] == [None, *(STORE_T0_MS + i for i in range(HIGH - 1))]


def test_a_flipped_byte_inside_a_batch_fails_exactly_the_offsets_of_that_batch(
    tmp_path: Path,
) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    assert inject.flip_value_byte(d, STORE_QUEUE, 0, 5) == (3, 7)
    rows = _rows(d, split_records=2)
    assert [r["offset"] for r in rows] == list(range(HIGH))
    bad = [r for r in rows if not r["crc_ok"]]
    assert [r["offset"] for r in bad] == [3, 4, 5, 6, 7]
    assert {r["crc"] for r in bad} == {_stored_crc(d, 3)}
    assert all("crc32c mismatch in batch [3, 7]" in r["error"] for r in bad)
    assert all(r["value"] is None and r["timestamp_ms"] is None for r in bad)
    # The damaged batch's stored size is counted once, on its first row.
    assert [r["size_bytes"] for r in bad][1:] == [None] * 4 and bad[0]["size_bytes"] > 0
    good = [r for r in rows if r["crc_ok"]]
    assert all(r["value"] == b"value-%d" % r["offset"] for r in good)
    # ts_prev skips the damaged batch: offset 8's previous good record is offset 2.
    (after,) = [r for r in good if r["offset"] == 8]
    assert after["ts_prev"] == STORE_T0_MS + 2


def test_a_lost_batch_leaves_exactly_its_offsets_missing(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    assert inject.delete_batch(d, STORE_QUEUE, 0, 9) == (8, 11)
    offsets = [r["offset"] for r in _rows(d, split_records=3, names=["offset"])]
    assert offsets == [*range(8), *range(12, HIGH)]


def test_a_batch_holding_low_shows_its_records_from_low_only(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d, truncate_before=5)  # inside the batch [3, 7]
    assert inject.watermarks(d, STORE_QUEUE, 0) == (5, HIGH)
    rows = _rows(d, split_records=2, names=["offset", "crc_ok", "ts_prev"])
    assert [r["offset"] for r in rows] == list(range(5, HIGH))
    assert all(r["crc_ok"] for r in rows)
    assert rows[0]["ts_prev"] is None  # nothing shown before low


def test_a_damaged_batch_holding_low_is_reported_from_low(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d, truncate_before=5)
    inject.flip_value_byte(d, STORE_QUEUE, 0, 6)
    rows = _rows(d, names=["offset", "crc_ok"])
    assert [r["offset"] for r in rows if not r["crc_ok"]] == [5, 6, 7]
    assert [r["offset"] for r in rows] == list(range(5, HIGH))


def test_a_batch_left_below_low_or_stored_past_high_is_shown(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d, truncate_before=8)  # batches [0, 2] and [3, 7] deleted
    inject.put_batch(d, STORE_QUEUE, 0, [NewRecord(STORE_T0_MS, b"stale")], base=1)
    inject.put_batch(d, STORE_QUEUE, 0, [NewRecord(STORE_T0_MS + 99, b"x")] * 2, base=HIGH + 5)
    offsets = [r["offset"] for r in _rows(d, split_records=4, names=["offset", "crc_ok"])]
    assert offsets == [1, *range(8, HIGH), HIGH + 5, HIGH + 6]


def test_a_misplaced_batch_fails_its_check_at_the_offsets_it_claims(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    assert inject.misplace_batch(d, STORE_QUEUE, 0, 4, to_base=HIGH + 10) == (
        HIGH + 10,
        HIGH + 14,
    )
    rows = _rows(d, names=["offset", "crc_ok"])
    assert [r["offset"] for r in rows] == [*range(HIGH), *range(HIGH + 10, HIGH + 15)]
    assert [r["offset"] for r in rows if not r["crc_ok"]] == list(range(HIGH + 10, HIGH + 15))


def _patch_batch(d: Path, base: int, edit: Any) -> None:
    lid = inject.log_id(d, STORE_QUEUE, 0)
    with inject._env(d) as (txn, batches, _kv):
        key = position(lid, base)
        txn.put(key, edit(bytes(txn.get(key, db=batches))), db=batches)


def test_a_damaged_count_is_bounded_by_the_next_stored_batch(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    # count (u32 at bytes 7..10) of the batch [3, 7] claims 5 + 2**16 records
    _patch_batch(d, 3, lambda b: b[:8] + bytes([b[8] ^ 1]) + b[9:])
    rows = _rows(d, names=["offset", "crc_ok", "error"])
    assert [r["offset"] for r in rows] == list(range(HIGH))
    assert [r["offset"] for r in rows if not r["crc_ok"]] == [3, 4, 5, 6, 7]


def test_a_damaged_count_of_the_last_batch_is_bounded_by_the_high_watermark(
    tmp_path: Path,
) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    _patch_batch(d, 13, lambda b: b[:8] + bytes([b[8] ^ 1]) + b[9:])  # [13, 18] claims more
    rows = _rows(d, names=["offset", "crc_ok"])
    assert [r["offset"] for r in rows] == list(range(HIGH))
    assert [r["offset"] for r in rows if not r["crc_ok"]] == list(range(13, HIGH))


def test_a_damaged_count_past_high_is_bounded_by_what_the_bytes_can_hold(
    tmp_path: Path,
) -> None:
    """Past high and with no batch after it, only the stored size bounds a count the crc no
    longer vouches for: a record takes at least its fixed head."""
    d = tmp_path / "n1"
    build_batch_store(d)
    base, _last = inject.misplace_batch(d, STORE_QUEUE, 0, 4, to_base=HIGH + 10)
    stored: list[bytes] = []

    def flip_count(b: bytes) -> bytes:
        stored.append(b)
        return b[:8] + bytes([b[8] ^ 1]) + b[9:]

    _patch_batch(d, base, flip_count)
    holds_max = (len(stored[0]) - record_batch.HEADER_SIZE) // record_batch.RECORD_HEAD_SIZE
    assert 5 < holds_max < 2**16
    rows = _rows(d, names=["offset", "crc_ok"])
    assert [r["offset"] for r in rows if not r["crc_ok"]] == list(range(base, base + holds_max))


def test_a_batch_too_short_for_its_header_is_one_row_at_its_base(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    _patch_batch(d, 8, lambda b: b[:10])  # a torn write
    rows = _rows(d, names=["offset", "crc_ok", "error", "size_bytes"])
    (bad,) = [r for r in rows if not r["crc_ok"]]
    assert (bad["offset"], bad["size_bytes"]) == (8, 10)
    assert "shorter than a batch header" in bad["error"]
    assert [r["offset"] for r in rows] == [*range(9), *range(12, HIGH)]  # 9..11 missing


def test_damaged_log_metadata_is_flagged_and_its_batches_still_read(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    build_batch_store(d)
    inject.damage_logmeta(d, STORE_QUEUE, 0)
    (log,) = _logs(d)
    assert "crc32c" in log["meta_error"]
    assert [r["offset"] for r in _rows(d, names=["offset"])] == list(range(HIGH))


def test_a_store_of_record_format_1_is_refused_naming_fluxmq_migrate(tmp_path: Path) -> None:
    d = tmp_path / "old"
    d.mkdir()
    env = lmdb.open(str(d), subdir=True, max_dbs=8)
    for name in (b"log", b"logmeta", b"kv"):  # what a format-1 LmdbStore created
        env.open_db(name)
    env.close()
    with pytest.raises(OldFormatError, match="fluxmq migrate --data-dir"):
        LmdbInspector(str(d))
