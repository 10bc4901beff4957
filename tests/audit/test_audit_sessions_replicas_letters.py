"""What the audit missed before: producer sequences stored twice or with gaps, a replica whose
watermarks disagree with the others', dead letters that lost their headers, and letters that do
not add up to the dead counted. The faults are written with a codec made from RECORD_BATCH.md
alone (tests/audit/spec_codec.py), never the project's encoder or decoder."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from fluxmq.core import keys
from tests.audit import inject, spec_inject
from tests.audit.conftest import Copier
from tests.audit.data import ORDERS, SESSION_LAYOUT, SESSIONS
from tests.audit.spec_codec import SpecBatch
from tests.audit.test_audit_rules import busiest_partitions, run

pytestmark = pytest.mark.slow

DLQ = f"{ORDERS}.dlq"


def applied_index(data_dir: Path) -> int:
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8, readonly=True)
    try:
        with env.begin() as txn:
            raw = txn.get(keys.APPLIED, db=env.open_db(b"kv", txn=txn, create=False))
    finally:
        env.close()
    assert raw is not None
    return int.from_bytes(raw, "big")


def test_the_session_layout_is_what_the_broker_stored(single_copy: Copier) -> None:
    """The injected faults below are placed by SESSION_LAYOUT: check it against the store."""
    (d,) = single_copy("layout")
    for partition, layout in SESSION_LAYOUT.items():
        stored = spec_inject.batches(d, SESSIONS, partition)
        assert [(b.producer_epoch, b.first_sequence, len(b.records)) for b in stored] == [
            (epoch, seq, count) for _producer, epoch, seq, count in layout
        ]
        assert [b.producer_id == 0 for b in stored] == [p is None for p, *_ in layout]


def test_a_producer_sequence_stored_twice_is_found_and_on_one_replica_also_its_shape(
    cluster_copy: Copier, tmp_path: Path
) -> None:
    n0, n1, n2 = cluster_copy("twice")
    expected = set()
    # Alpha's epoch-0 request of sequences 3..4 (offsets 4..5), stored again at the end of
    # partition 0 on every replica (as a bug that replicates would).
    for d in (n0, n1, n2):
        first, last = spec_inject.append_copy(d, SESSIONS, 0, base=4)
        assert (first, last) == (11, 12)
        expected.add(("producer_sequence", d.name, SESSIONS, 0, 11))  # one per stored request
    # On one replica alone, alpha's encoded epoch-0 batch of partition 1 (offsets 0..3) again:
    # its high watermark is 10 where the others have 6. It is the replica that applied least
    # (the cluster's stop may leave one behind the others), so none of them may hold less.
    odd = min((n0, n1, n2), key=lambda d: (applied_index(d), d.name))
    first, last = spec_inject.append_copy(odd, SESSIONS, 1, base=0)
    assert (first, last) == (6, 9)
    expected.add(("producer_sequence", odd.name, SESSIONS, 1, 6))
    expected.add(("replica_shape", odd.name, SESSIONS, 1, 6))

    summary, found = run(tmp_path / "report", data_dirs=[str(n0), str(n1), str(n2)])

    assert found == expected
    by_rule = {r.name: r for r in summary.rules}
    (shape,) = by_rule["replica_shape"].sample
    assert "[0, 10) here" in shape["detail"] or "holds offsets [0, 10) where" in shape["detail"]
    assert "[0, 6)" in shape["detail"]
    twice = [v for v in by_rule["producer_sequence"].sample if v["offset"] == 11]
    assert len(twice) == 3
    for v in twice:
        assert (
            "epoch 0 sequences 3..4 are stored twice: at offsets 11..12, and from offset 4"
            in (v["detail"])
        )
        assert "epochs never go back" in v["detail"]  # epoch 1 was stored before it


def test_sequence_gaps_stripped_letters_and_uncounted_dead_are_found(
    single_copy: Copier, tmp_path: Path
) -> None:
    (d,) = single_copy("letters")
    node = d.name

    # Alpha's last epoch-1 request of partition 0 (offset 10, sequence 2) resealed as
    # sequence 5: 2..4 missing. Its epoch-1 batch of partition 1 (offsets 4..5) as beginning at
    # sequence 7: a new epoch begins at 0.
    def skip_to(seq: int):  # type: ignore[no-untyped-def]
        def change(batch: SpecBatch) -> None:
            batch.first_sequence = seq

        return change

    spec_inject.reseal(d, SESSIONS, 0, 10, skip_to(5))
    spec_inject.reseal(d, SESSIONS, 1, 4, skip_to(7))
    expected = {
        ("producer_sequence", node, SESSIONS, 0, 10),
        ("producer_sequence", node, SESSIONS, 1, 4),
    }
    # A dead letter stripped of its fluxmq-original-* headers: the store's index still names it.
    spec_inject.edit_headers(
        d, DLQ, 0, 1, lambda hs: [h for h in hs if not h[0].startswith("fluxmq-original-")]
    )
    expected.add(("dlq_conservation", node, DLQ, 0, 1))
    # A letter whose headers name another origin than the index does.
    spec_inject.edit_headers(
        d,
        DLQ,
        0,
        2,
        lambda hs: [(k, b"events" if k == "fluxmq-original-queue" else v) for k, v in hs],
    )
    expected.add(("dlq_conservation", node, DLQ, 0, 2))
    # One more dead counted (and one less acked, so the row's totals still add up) than the
    # DLQ holds letters for: a lost letter.
    p = next(p for p in busiest_partitions(d) if inject.group_row(d, ORDERS, "billing", p)["acked"])
    row = inject.group_row(d, ORDERS, "billing", p)
    inject.edit_group_row(d, ORDERS, "billing", p, acked=row["acked"] - 1, dead=row["dead"] + 1)
    expected.add(("dlq_conservation", node, ORDERS, None, None))

    summary, found = run(tmp_path / "report", data_dirs=[str(d)])

    assert found == expected
    details = {
        (v["queue"], v["partition"], v["offset"]): v["detail"]
        for r in summary.rules
        for v in r.sample
    }
    assert "sequence 5 (offset 10) follows 1 (offset 9)" in details[(SESSIONS, 0, 10)]
    assert "2..4 are missing" in details[(SESSIONS, 0, 10)]
    assert "begins at sequence 7 (offset 4), not 0" in details[(SESSIONS, 1, 4)]
    assert "dead letter of orders" in details[(DLQ, 0, 1)]
    assert "no fluxmq-original-* headers" in details[(DLQ, 0, 1)]
    assert "name origin events" in details[(DLQ, 0, 2)]
    assert "counted 6 dead, and orders.dlq holds 5" in details[(ORDERS, None, None)]
