"""The audit on real broker data: clean data reports clean, and every injected fault is reported
by exactly the rule meant to catch it, at exactly its place (tests/audit/inject.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fluxmq.audit import job, rules
from fluxmq.audit.job import SparkSettings
from storage.api import NewRecord
from tests.audit import inject
from tests.audit.conftest import Copier
from tests.audit.data import (
    BATCHED,
    EVENTS,
    LEFT,
    ORDERS,
    ORDERS_PARTITIONS,
    RIGHT,
    SHARED_DLQ,
    SHORT,
)

pytestmark = pytest.mark.slow

SETTINGS = SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g")
RULE_NAMES = {"store_readable"} | {r.name for r in rules.RULES}

Found = set[tuple[str, str, str, int, int | None]]  # rule, node, queue, partition, offset


def run(out: Path, **source: object) -> tuple[job.report.Summary, Found]:
    summary = job.audit(str(out), SETTINGS, print, sample_rows=1000, **source)  # type: ignore[arg-type]
    found: Found = set()
    for r in summary.rules:
        assert r.violations == len(r.sample), r  # every violation is in the sample
        stored = pq.read_table(out / "violations" / r.name).num_rows
        assert stored == r.violations, (r.name, stored, r.violations)
        found |= {(v["rule"], v["node"], v["queue"], v["partition"], v["offset"]) for v in r.sample}
    return summary, found


def busiest_partitions(data_dir: Path) -> list[int]:
    """ORDERS partitions, the one with the most records first."""
    highs = {p: inject.high(data_dir, ORDERS, p) for p in range(ORDERS_PARTITIONS)}
    return sorted(highs, key=lambda p: -highs[p])


def test_clean_single_node_data_reports_clean(single_copy: Copier, tmp_path: Path) -> None:
    dirs = single_copy("clean")
    summary, found = run(tmp_path / "report", data_dirs=[str(d) for d in dirs])
    assert found == set()
    assert summary.clean
    assert {r.name for r in summary.rules} == RULE_NAMES
    assert summary.records > 100
    by_group = {(g["queue"], g["group"]): g for g in summary.groups}
    billing = by_group[(ORDERS, "billing")]
    assert (billing["published"], billing["acked"], billing["dead"], billing["leased"]) == (
        80,
        20,
        5,
        5,
    )
    short = by_group[(SHORT, "g")]
    assert (
        short["dead"] == 3 and short["removed"] > 0
    )  # dead letters whose origin retention removed
    # Two queues sharing one DLQ: each letter is audited against its own origin.
    assert by_group[(LEFT, "g")]["dead"] == by_group[(RIGHT, "g")]["dead"] == 2


def test_clean_replicas_report_clean(cluster_copy: Copier, tmp_path: Path) -> None:
    dirs = cluster_copy("clean")
    summary, found = run(tmp_path / "report", data_dirs=[str(d) for d in dirs])
    assert found == set()
    assert summary.clean
    assert len({i["replication_group"] for i in summary.inputs}) == 1  # one group, 3 replicas


def _inject_common(d: Path, *, flip: bool, delete: bool, committed: bool) -> Found:
    """Faults that are on this replica only when asked; the idempotency and DLQ faults are on
    every copy (a bug replicates). -> what the audit must report for ``d``."""
    node = d.name
    p, q = busiest_partitions(d)[:2]
    expected: Found = set()
    if flip:
        first, last = inject.flip_value_byte(d, ORDERS, p, 1)
        expected |= {("crc_valid", node, ORDERS, p, o) for o in range(first, last + 1)}
        # Inside a batch of five records (one Publish): all five are reported, no other.
        assert inject.flip_value_byte(d, BATCHED, 0, 5) == (3, 7)
        expected |= {("crc_valid", node, BATCHED, 0, o) for o in (3, 4, 5, 6, 7)}
    if delete:
        first, _last = inject.delete_batch(d, ORDERS, p, 3)
        expected.add(("offset_contiguity", node, ORDERS, p, first))
        # A lost batch of four records is one gap, reported at its first offset.
        assert inject.delete_batch(d, BATCHED, 0, 9) == (8, 11)
        expected.add(("offset_contiguity", node, BATCHED, 0, 8))
    if committed:
        past = inject.high(d, ORDERS, p) + 10
        inject.edit_group_row(d, ORDERS, "billing", p, committed=past)
        expected.add(("group_consistency", node, ORDERS, p, past))
    original = inject.read(d, ORDERS, q, 1)
    inject.rewrite(d, ORDERS, q, 2, idempotency_key=original.idempotency_key)
    expected.add(("dedup_window", node, ORDERS, q, 2))
    inject.set_header(d, f"{ORDERS}.dlq", 0, 0, "fluxmq-original-offset", b"999999")
    expected.add(("dlq_conservation", node, f"{ORDERS}.dlq", 0, 0))
    # In the shared DLQ: one of RIGHT's letters; LEFT's (purged) and RIGHT's other stay clean.
    inject.set_header(d, SHARED_DLQ, 0, 3, "fluxmq-original-offset", b"999999")
    expected.add(("dlq_conservation", node, SHARED_DLQ, 0, 3))
    return expected


def test_each_fault_in_single_node_data_is_reported_by_its_rule_only(
    single_copy: Copier, tmp_path: Path
) -> None:
    (d,) = single_copy("faults")
    expected = _inject_common(d, flip=True, delete=True, committed=True)
    summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    assert found == expected
    assert {r.name for r in summary.rules if not r.ok} == {rule for rule, *_ in expected}
    assert not summary.clean


def test_each_fault_in_replicas_is_reported_by_its_rule_only(
    cluster_copy: Copier, tmp_path: Path
) -> None:
    n0, n1, n2 = cluster_copy("faults")
    expected = _inject_common(n0, flip=True, delete=False, committed=True)
    expected |= _inject_common(n1, flip=False, delete=True, committed=False)
    expected |= _inject_common(n2, flip=False, delete=False, committed=False)
    old = inject.rewrite(n2, EVENTS, 0, 4, value=b"what n2 alone says")
    assert old.value != b"what n2 alone says"
    expected.add(("replica_agreement", n2.name, EVENTS, 0, 4))
    summary, found = run(tmp_path / "report", data_dirs=[str(n0), str(n1), str(n2)])
    assert found == expected
    (agreement,) = [r for r in summary.rules if r.name == "replica_agreement"]
    assert "n0,n1" in agreement.sample[0]["detail"]  # the majority it disagrees with


def test_a_misplaced_batch_and_damaged_log_metadata_are_reported_where_they_are(
    single_copy: Copier, tmp_path: Path
) -> None:
    """A batch copied to a place past the high watermark fails its crc there (the crc covers
    its position) and lies outside the watermarks; damaged metadata of a log is reported for
    the log, with no offset."""
    (d,) = single_copy("placement")
    high = inject.high(d, BATCHED, 0)
    first, last = inject.misplace_batch(d, BATCHED, 0, 4, to_base=high + 2)
    assert (first, last) == (high + 2, high + 6)
    inject.damage_logmeta(d, EVENTS, 1)
    summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    node = d.name
    misplaced = range(first, last + 1)
    assert found == {
        *(("crc_valid", node, BATCHED, 0, o) for o in misplaced),
        *(("offset_contiguity", node, BATCHED, 0, o) for o in misplaced),
        ("offset_contiguity", node, EVENTS, 1, None),
    }
    (contiguity,) = [r for r in summary.rules if r.name == "offset_contiguity"]
    assert any("log metadata is damaged" in v["detail"] for v in contiguity.sample)


def test_an_intact_batch_overlapping_another_fails_offset_contiguity_at_each_offset_twice(
    single_copy: Copier, tmp_path: Path
) -> None:
    """Two stored batches that both hold offsets 5 and 6, each with a valid crc (a batch
    written twice at different bases): the log stores those offsets twice."""
    (d,) = single_copy("overlap")
    assert inject.batch_range(d, BATCHED, 0, 5) == (3, 7)
    again = [inject.read(d, BATCHED, 0, o) for o in (5, 6)]
    inject.put_batch(
        d,
        BATCHED,
        0,
        [NewRecord(r.timestamp_ms, r.value, r.key, r.headers, r.idempotency_key) for r in again],
        base=5,
    )
    summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    assert found == {("offset_contiguity", d.name, BATCHED, 0, o) for o in (5, 6)}
    (contiguity,) = [r for r in summary.rules if r.name == "offset_contiguity"]
    assert all("stored more than once" in v["detail"] for v in contiguity.sample)


def test_an_export_archive_audits_like_the_data_dirs(single_copy: Copier, tmp_path: Path) -> None:
    (d,) = single_copy("faults")
    expected = _inject_common(d, flip=True, delete=True, committed=True)
    manifest = job.export([str(d)], str(tmp_path / "archive"), SETTINGS, print, overwrite=False)
    assert manifest["rows"]["records"] > 100
    on_disk = json.loads((tmp_path / "archive" / "manifest.json").read_text())
    assert on_disk["stores"][0]["node"] == d.name
    summary, found = run(tmp_path / "report", archive=str(tmp_path / "archive"))
    assert found == expected
    assert summary.source == "archive"


def test_a_count_without_offsets_behind_it_fails_totals(
    single_copy: Copier, tmp_path: Path
) -> None:
    """The group row's counters are checked against its offsets: an ack count that grew without
    an offset behind it breaks ``next - base == acked + ...``, and only that rule sees it."""
    (d,) = single_copy("totals")
    p = busiest_partitions(d)[0]
    row = inject.group_row(d, ORDERS, "billing", p)
    inject.edit_group_row(d, ORDERS, "billing", p, acked=row["acked"] + 1)
    _summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    assert found == {("totals", d.name, ORDERS, p, None)}


def test_an_unreadable_delivery_run_fails_totals_and_the_audit_goes_on(
    single_copy: Copier, tmp_path: Path
) -> None:
    """A group's pending deliveries are stored as runs; one that cannot be read loses its
    offsets from the counts, which the partition row's totals then contradict."""
    (d,) = single_copy("run")
    p = inject.truncate_slot_run(d, ORDERS, "billing")
    _summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    assert found == {("totals", d.name, ORDERS, p, None)}


def test_a_key_stored_out_of_time_order_fails_key_order(
    single_copy: Copier, tmp_path: Path
) -> None:
    (d,) = single_copy("order")
    p = busiest_partitions(d)[0]
    first = inject.read(d, ORDERS, p, 0)
    later = next(
        o
        for o in range(1, inject.high(d, ORDERS, p))
        if inject.read(d, ORDERS, p, o).key == first.key
    )
    inject.rewrite(d, ORDERS, p, later, timestamp_ms=first.timestamp_ms - 1)
    _summary, found = run(tmp_path / "report", data_dirs=[str(d)])
    assert found == {("key_order", d.name, ORDERS, p, later)}
