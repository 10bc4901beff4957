"""The audit's readers without Spark: layout discovery and what one store's tables hold."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from fluxmq.audit import layout, tables
from fluxmq.audit.layout import AuditUsageError, StoreRef
from storage.api import NewRecord
from storage.lmdb_inspect import LmdbInspector
from tests.audit import inject
from tests.audit.conftest import Copier
from tests.audit.data import BATCHED, BATCHED_SIZES, ORDERS


def test_layout_doctests() -> None:
    assert doctest.testmod(layout).failed == 0


def test_node_names_are_unique_and_a_repeated_explicit_name_is_refused() -> None:
    assert layout.node_names(["a/n1", "b/n1", "b/n1"]) == [
        ("n1", "a/n1"),
        ("n1-2", "b/n1"),
        ("n1-3", "b/n1"),
    ]
    with pytest.raises(AuditUsageError, match="given twice"):
        layout.node_names(["x=a", "x=b"])


def test_replicas_share_their_group_and_single_nodes_never_do(
    single_pristine: list[Path], cluster_pristine: list[Path]
) -> None:
    stores = layout.discover([str(p) for p in [*single_pristine, *cluster_pristine]])
    groups = {s.node: s.replication_group for s in stores}
    assert groups["solo"] == "single:solo"
    assert groups["n0"] == groups["n1"] == groups["n2"] != groups["solo"]


def test_a_mode_file_of_another_program_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "data.mdb").write_bytes(b"")
    (tmp_path / "d" / "MODE").write_text("postgres\n")
    with pytest.raises(AuditUsageError, match="not a FluxMQ data directory"):
        layout.discover([str(tmp_path / "d")])


def _records(store: StoreRef, names: list[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with LmdbInspector(store.path) as ins, ins.view() as view:
        for split in tables.splits(store, view, split_records=7):
            for batch in tables.read_split(split, view, names):
                rows.extend(batch.to_pylist())
    return rows


def test_every_record_is_read_once_and_a_damaged_one_is_flagged_not_dropped(
    single_copy: Copier,
) -> None:
    (d,) = single_copy("read")
    first, last = inject.flip_value_byte(d, ORDERS, 0, 2)
    (store,) = [s for s in layout.discover([str(d)])]
    rows = _records(store, [n for n, _ in tables.RECORDS])
    orders = [r for r in rows if r["queue"] == ORDERS]
    keys = [(r["partition"], r["offset"]) for r in orders]
    assert len(keys) == len(set(keys)) == 80  # small splits, none read twice
    bad = [r for r in orders if not r["crc_ok"]]
    assert [(r["partition"], r["offset"]) for r in bad] == [(0, o) for o in range(first, last + 1)]
    assert all(r["value"] is None and r["crc"] is not None for r in bad)
    assert all("crc32c" in str(r["error"]) for r in bad)
    good = [r for r in orders if r["crc_ok"]]
    assert all(r["value"] and r["idempotency_key"] for r in good)
    dead = [r for r in rows if r["queue"] == f"{ORDERS}.dlq"]
    assert len(dead) == 5 and all(r["origin_queue"] == ORDERS for r in dead)
    assert all(r["dead_group"] == "billing" and r["origin_offset"] is not None for r in dead)


def test_a_flipped_byte_in_a_multi_record_batch_of_broker_data_fails_that_batch_only(
    single_copy: Copier,
) -> None:
    """One Publish of 5 messages is one stored batch [3, 7]: a byte flipped in the value of
    offset 5 makes every record of that batch unreadable, and no other."""
    (d,) = single_copy("batch")
    assert inject.batch_range(d, BATCHED, 0, 5) == (3, 7)
    assert inject.flip_value_byte(d, BATCHED, 0, 5) == (3, 7)
    (store,) = layout.discover([str(d)])
    rows = [
        r
        for r in _records(store, ["queue", "offset", "crc_ok", "crc", "error"])
        if r["queue"] == BATCHED
    ]
    assert [r["offset"] for r in rows] == list(range(sum(BATCHED_SIZES)))
    bad = [r for r in rows if not r["crc_ok"]]
    assert [r["offset"] for r in bad] == [3, 4, 5, 6, 7]
    assert len({r["crc"] for r in bad}) == 1
    assert all("crc32c mismatch in batch [3, 7]" in str(r["error"]) for r in bad)


def test_a_narrow_schema_decodes_only_its_columns(single_pristine: list[Path]) -> None:
    (store,) = layout.discover([str(single_pristine[0])])
    rows = _records(store, ["offset", "crc_ok"])
    assert rows and set(rows[0]) == {"offset", "crc_ok"}


def test_records_stored_outside_the_watermarks_are_read(single_copy: Copier) -> None:
    (d,) = single_copy("stray")
    high = inject.high(d, ORDERS, 0)
    last = inject.read(d, ORDERS, 0, high - 1)
    # A batch of two copies of the last record, past the watermark.
    record = NewRecord(last.timestamp_ms, last.value, last.key, last.headers, None)
    inject.put_batch(d, ORDERS, 0, [record, record], base=high + 5)
    (store,) = layout.discover([str(d)])
    rows = _records(store, ["queue", "partition", "offset"])
    offsets = [r["offset"] for r in rows if r["queue"] == ORDERS and r["partition"] == 0]
    assert offsets == [*range(high), high + 5, high + 6]


def test_ts_prev_is_the_previous_good_timestamp_across_splits_and_damage(
    single_copy: Copier,
) -> None:
    (d,) = single_copy("tsprev")
    first, last = inject.flip_value_byte(d, ORDERS, 0, 3)
    (store,) = layout.discover([str(d)])
    rows = [
        r
        for r in _records(store, ["queue", "partition", "offset", "timestamp_ms", "ts_prev"])
        if r["queue"] == ORDERS and r["partition"] == 0
    ]
    previous = None
    for r in rows:  # splits of 7 offsets: several boundaries, one damaged batch holding 3
        if r["offset"] in range(first, last + 1):
            assert r["timestamp_ms"] is None and r["ts_prev"] is None
            continue
        assert r["ts_prev"] == previous, r
        previous = r["timestamp_ms"]
    assert len(rows) > 14


def test_each_local_shard_of_a_node_with_shard_processes_is_a_group_of_its_own(
    tmp_path: Path,
) -> None:
    from fluxmq.server.shard_process.supervisor import LOCAL_SHARDS_DIR

    assert layout.LOCAL_SHARDS_DIR == LOCAL_SHARDS_DIR  # the audit reads what the node writes
    node = tmp_path / "solo"
    for store in (node, node / LOCAL_SHARDS_DIR / "1", node / LOCAL_SHARDS_DIR / "2"):
        store.mkdir(parents=True, exist_ok=True)
        (store / "data.mdb").write_bytes(b"")
        (store / "MODE").write_text("single\n")
    groups = [s.replication_group for s in layout.discover([str(node)])]
    assert groups == ["single:solo", "single:solo/local-1", "single:solo/local-2"]
