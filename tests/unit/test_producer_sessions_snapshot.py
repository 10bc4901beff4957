"""Producer sessions travel in a snapshot (issue 23, item 2): a replica that installs one and then
leads answers a retried request with its first offsets, fences the epochs the source fenced,
expects the sequence the source expects, never hands out a producer id twice, and resumes an
expiry pass where the source left it. Memory and LMDB stores (the snapshot module's fixture);
the rules of sessions themselves are in test_producer_sessions.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import commands, keys, producers
from fluxmq.core.commands.results import AppendResult, RetentionResult
from fluxmq.core.errors import FluxError
from fluxmq.core.producers import ProducerGrant
from fluxmq.core.state_machine import QueueStateMachine
from tests.unit.test_producer_sessions import init, session_cmd
from tests.unit.test_state_machine import T0, Driver, E
from tests.unit.test_state_machine_snapshot import StoreFactory, Twin, snapshot_into
from tests.unit.test_state_machine_snapshot import make_store as make_store  # memory and LMDB


def appended(res: object) -> AppendResult:
    assert isinstance(res, AppendResult), res
    return res


def refused(res: object, reason: str) -> FluxError:
    assert isinstance(res, FluxError) and res.reason == reason, res
    return res


def test_replica_from_a_snapshot_answers_a_retry_with_the_first_offsets(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    d = Driver(make_store())
    q = d.create(partitions=2)
    g = init(d, q, "billing")
    a = appended(d.one(session_cmd(q, g, 0, [b"a", b"b"], partition=1)))
    c = appended(d.one(session_cmd(q, g, 2, [b"c"], partition=1, now_ms=T0 + 10)))
    replica = snapshot_into(d.sm, make_store(), tmp_path / "snap")
    assert replica.digest() == d.sm.digest()
    twin = Twin(d.sm, replica)  # the replica now leads; the source applies alike
    for first, seq, values in ((c, 2, [b"c"]), (a, 0, [b"a", b"b"])):
        again = appended(twin.one(session_cmd(q, g, seq, values, partition=1, now_ms=T0 + 99)))
        assert (again.offsets, again.timestamps_ms) == (first.offsets, first.timestamps_ms)
        assert again.duplicates == [True] * len(values)
    gap = refused(twin.one(session_cmd(q, g, 9, [b"x"], partition=1)), "OUT_OF_ORDER_SEQUENCE")
    assert gap.metadata["expected_sequence"] == "3"
    nxt = appended(twin.one(session_cmd(q, g, 3, [b"d"], partition=1)))
    assert (nxt.offsets, nxt.duplicates) == ([3], [False])
    assert replica.digest() == d.sm.digest()


def test_replica_from_a_snapshot_fences_the_epoch_the_source_fenced(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    d = Driver(make_store())
    q = d.create()
    old = init(d, q, "billing")
    appended(d.one(session_cmd(q, old, 0, [b"a"])))
    new = init(d, q, "billing")
    replica = snapshot_into(d.sm, make_store(), tmp_path / "snap")
    twin = Twin(d.sm, replica)
    refused(twin.one(session_cmd(q, old, 1, [b"zombie"])), "PRODUCER_FENCED")
    # The name travelled with its id and epoch: the next InitProducer fences ``new`` in turn.
    newer = twin.one(
        cpb.InitProducerCmd(queue="q", queue_id=q.queue_id, now_ms=T0, producer_name="billing")
    )
    assert newer == ProducerGrant(new.producer_id, new.producer_epoch + 1)
    refused(twin.one(session_cmd(q, new, 0, [b"b"])), "PRODUCER_FENCED")


def test_replica_from_a_snapshot_never_grants_a_producer_id_twice(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    d = Driver(make_store())
    q = d.create()
    before = {init(d, q).producer_id for _ in range(3)}
    replica = snapshot_into(d.sm, make_store(), tmp_path / "snap")
    grant = Twin(d.sm, replica).one(cpb.InitProducerCmd(queue="q", queue_id=q.queue_id, now_ms=T0))
    assert isinstance(grant, ProducerGrant) and grant.producer_id not in before


def test_replica_that_installs_a_snapshot_then_applies_later_session_entries_dedups_them(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """Raft's flow: the snapshot at index n, the leader goes on, the follower installs the
    snapshot and applies the entries after n, then leads and gets a retry."""
    d = Driver(make_store())
    q = d.create()
    g = init(d, q)
    appended(d.one(session_cmd(q, g, 0, [b"a"])))
    snap_index = d.sm.write_snapshot(str(tmp_path / "snap"))
    later_cmd = session_cmd(q, g, 1, [b"b", b"c"], now_ms=T0 + 5)
    later = appended(d.one(later_cmd))
    replica = QueueStateMachine(make_store())
    replica.install_snapshot(str(tmp_path / "snap"))
    replica.apply_batch([E(snap_index + 1, commands.encode(later_cmd))])
    assert replica.digest() == d.sm.digest()
    retry_cmd = session_cmd(q, g, 1, [b"b", b"c"], now_ms=T0 + 50)
    (retry,) = replica.apply_batch([E(snap_index + 2, commands.encode(retry_cmd))])
    retry = appended(retry)
    assert (retry.offsets, retry.timestamps_ms) == (later.offsets, later.timestamps_ms)
    assert retry.duplicates == [True, True]
    with replica.store.read() as txn:
        log = txn.log(keys.log_id(q.queue_id, 0))
        assert [r.value for r in log.read(0, 100, 1 << 20)] == [b"a", b"b", b"c"]


def test_expiry_pass_resumes_on_the_replica_where_the_source_stopped(
    make_store: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producers, "EXPIRY_ROWS_PER_PASS_MAX", 3)
    d = Driver(make_store())
    q = d.create()
    for _ in range(7):
        init(d, q)
    now = T0 + producers.IDLE_EXPIRY_MS + 1
    first = d.one(cpb.ApplyRetentionCmd(now_ms=now))
    assert isinstance(first, RetentionResult) and first.expired_producers == 3
    replica = snapshot_into(d.sm, make_store(), tmp_path / "snap")
    twin = Twin(d.sm, replica)
    counts = []
    for _ in range(3):
        res = twin.one(cpb.ApplyRetentionCmd(now_ms=now))
        assert isinstance(res, RetentionResult)
        counts.append(res.expired_producers)
    assert counts == [3, 1, 0]
    assert replica.digest() == d.sm.digest()
