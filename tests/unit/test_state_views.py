"""One owner per state: the applier publishes an immutable view after each commit, and readers
read only that view (and read transactions), so a reader never waits on an apply or its fsync.

A store whose commits stall until released stands for an apply stuck in its disk flush."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.reader import QueueReader
from fluxmq.core.views import DeliveryView
from storage import LmdbStore
from tests.unit.test_state_machine import T0, Driver, E, receipts_of

STALL_S = 10.0
READ_WITHIN_S = 2.0


class StallingStore:
    """An LmdbStore (read transactions are snapshots, as in production) whose write
    transactions, once ``stall`` is set, wait before they commit until ``release`` is set; or
    fail there (rolled back) once ``fail`` is set."""

    def __init__(self, path: Path) -> None:
        self._inner = LmdbStore(str(path))
        self.stall = False
        self.fail = False
        self.committing = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @contextmanager
    def write(self) -> Iterator[Any]:
        with self._inner.write() as txn:
            yield txn
            if self.fail:
                raise OSError("the disk is gone")
            if self.stall:
                self.committing.set()
                assert self.release.wait(STALL_S), "the test never released the commit"


def a_queue_with_one_lease(store: StallingStore) -> tuple[Driver, pb.Queue, list[pb.Receipt]]:
    d = Driver(store)  # type: ignore[arg-type]
    q = d.create("q", type=pb.QUEUE_TYPE_WORK)
    d.one(cpb.CreateGroupCmd(queue="q", queue_id=q.queue_id, group="g", now_ms=T0))
    d.append(q, [b"a", b"b", b"c"])
    leased = d.one(lease_cmd(q, 1))
    receipts = receipts_of(leased)  # type: ignore[arg-type]
    assert len(receipts) == 1
    return d, q, receipts


def lease_cmd(q: pb.Queue, n: int) -> cpb.LeaseCmd:
    return cpb.LeaseCmd(
        queue="q",
        queue_id=q.queue_id,
        group="g",
        consumer_id="c",
        max_messages=n,
        lease_ms=30_000,
        now_ms=T0,
    )


def ack_cmd(q: pb.Queue, receipts: list[pb.Receipt]) -> cpb.AckCmd:
    return cpb.AckCmd(queue="q", queue_id=q.queue_id, group="g", receipts=receipts, now_ms=T0)


def finishes(read: Callable[[], object]) -> object:
    """``read``'s answer, if it comes within READ_WITHIN_S (else the test fails: it waited)."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(read()), daemon=True)
    t.start()
    t.join(READ_WITHIN_S)
    assert not t.is_alive(), "a reader waited for an apply in progress"
    return out[0]


def test_readers_never_wait_for_an_apply_stuck_in_its_commit(tmp_path: Path) -> None:
    store = StallingStore(tmp_path)
    d, q, receipts = a_queue_with_one_lease(store)
    reader = QueueReader(d.sm)
    entry = reader.entry("q")
    before = d.sm.view
    store.stall = True
    applying = threading.Thread(
        target=d.sm.apply_batch, args=([E(d.index + 1, commands.encode(ack_cmd(q, receipts)))],)
    )
    applying.start()
    try:
        assert store.committing.wait(STALL_S)
        parts = finishes(lambda: reader.group_partitions(entry, "g", T0))
        assert sum(p.in_flight for p in parts) == 1  # type: ignore[attr-defined]
        desc = finishes(lambda: reader.describe_group(entry, "g", T0))
        assert dict(desc.in_flight_by_consumer) == {"c": 1}  # type: ignore[attr-defined]
        assert finishes(lambda: reader.in_flight(entry, "g", "c")) == 1
        assert finishes(lambda: reader.maybe_ready(entry, "g", T0)) == (True, None)
        assert d.sm.view is before, "nothing is published before the commit"
    finally:
        store.release.set()
        applying.join(STALL_S)
    assert d.sm.view is not before
    assert reader.in_flight(entry, "g", "c") == 0
    assert d.sm.view.applied_index == d.index + 1


def test_a_published_view_never_changes_afterwards(tmp_path: Path) -> None:
    store = StallingStore(tmp_path)
    d, q, _ = a_queue_with_one_lease(store)
    old = d.sm.view
    g_old = old.delivery.get(q.queue_id, "q", "g")
    parts, in_flight = dict(g_old.parts), dict(g_old.in_flight_by_member)
    d.one(lease_cmd(q, 2))
    assert dict(g_old.parts) == parts and dict(g_old.in_flight_by_member) == in_flight
    g_new = d.sm.view.delivery.get(q.queue_id, "q", "g")
    assert g_new.in_flight_by_member["c"] == 3 and g_old.in_flight_by_member["c"] == 1
    with pytest.raises(TypeError):
        g_new.parts[0] = g_old.parts[0]  # type: ignore[index]


def test_a_rolled_back_batch_publishes_nothing_and_the_state_follows_the_store(
    tmp_path: Path,
) -> None:
    store = StallingStore(tmp_path)
    d, q, receipts = a_queue_with_one_lease(store)
    before = d.sm.view
    store.fail = True
    with pytest.raises(OSError):
        d.run(ack_cmd(q, receipts))
    assert d.sm.view is before
    assert DeliveryView.of(d.sm.delivery) == before.delivery
    store.fail = False
    d.index -= 1  # the entry was never applied: the shard offers it again
    d.run(ack_cmd(q, receipts))
    assert QueueReader(d.sm).in_flight(d.sm.catalog["q"], "g", "c") == 0
