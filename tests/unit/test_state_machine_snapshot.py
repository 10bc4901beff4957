"""Snapshots of the queue state machine (raft.api.StateMachine.write_snapshot/install_snapshot),
its state digest, and entries whose indexes leave gaps. Every test runs on LmdbStore and on
MemoryStore; a snapshot is installed into a state machine of the same store implementation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands, keys
from fluxmq.core.commands.results import AppendResult, LeaseResult
from fluxmq.core.errors import FluxError
from fluxmq.core.state_machine import QueueStateMachine
from storage import LmdbStore, MemoryStore, Store
from tests.unit.test_delivery import ACKED, EXTENDED, LEASE_MS, Q, make, msg, values
from tests.unit.test_state_machine import T0, Driver, E, append_cmd
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB

StoreFactory = Callable[[], Store]


@pytest.fixture(params=["memory", "lmdb"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    made: list[Store] = []

    def make_one() -> Store:
        store: Store
        if request.param == "memory":
            store = MemoryStore()
        else:
            store = LmdbStore(str(tmp_path / f"store{len(made)}"), sync=False)
        made.append(store)
        return store

    yield make_one
    for one in made:
        one.close()


class Built:
    """A state machine with queues, records, dedup keys, groups and leases held at snapshot
    time: every kind of state a snapshot must carry."""

    def __init__(self, store: Store) -> None:
        self.orders = make(store, "orders", partitions=2, dedup_window="1h", max_attempts=3)
        self.d = self.orders.d
        self.sm = self.d.sm
        self.events = Q(self.d, self.d.create("events", retention=pb.Retention(max_messages=3)))
        self.orders.group("g")
        self.orders.group("h")
        self.orders.publish(
            msg(b"a", 0, idempotency_key="k-a"),
            msg(b"b", 1, idempotency_key="k-b"),
            msg(b"c", 0),
            msg(b"d", 1),
        )
        self.events.publish(*(msg(bytes([65 + i])) for i in range(5)))
        self.events.retention()
        # c1 holds two leases across the snapshot; c2's was acked; one is nacked for later.
        self.held = self.orders.lease("g", "c1", n=2, now=T0 + 10)
        settled = self.orders.lease("g", "c2", n=2, now=T0 + 20)
        acked, nacked = Q.receipts(settled)
        assert self.orders.ack([acked], "g", now=T0 + 30) == [ACKED]
        self.orders.nack([nacked], "g", now=T0 + 40, retry_at=T0 + 5_000)
        self.orders.lease("h", "c3", n=1, now=T0 + 50)


class Twin:
    """Feeds the same entries (same indexes) to two state machines and checks they answer
    alike."""

    def __init__(self, a: QueueStateMachine, b: QueueStateMachine) -> None:
        assert a.last_applied_index() == b.last_applied_index()
        self.a, self.b = a, b
        self.index = a.last_applied_index()

    def one(self, cmd: object) -> object:
        self.index += 1
        entry = E(self.index, commands.encode(cmd))
        (ra,) = self.a.apply_batch([entry])
        (rb,) = self.b.apply_batch([entry])
        # FluxError is an exception, compared by identity: compare what it says instead.
        same = repr(ra) == repr(rb) if isinstance(ra, FluxError) else ra == rb
        assert same, f"entry {self.index}: {ra!r} != {rb!r}"
        return ra


def snapshot_into(source: QueueStateMachine, replica_store: Store, path: Path) -> QueueStateMachine:
    applied = source.write_snapshot(str(path))
    assert applied == source.last_applied_index()
    replica = QueueStateMachine(replica_store)
    replica.install_snapshot(str(path))
    return replica


def test_installed_snapshot_reproduces_digest_applied_index_and_catalog(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    built = Built(make_store())
    replica = snapshot_into(built.sm, make_store(), tmp_path / "snap")
    assert replica.digest() == built.sm.digest()
    assert replica.last_applied_index() == built.sm.last_applied_index()
    assert replica.catalog == built.sm.catalog
    for name, partition in (("g", 0), ("g", 1), ("h", 0), ("h", 1)):
        g_source = built.sm.delivery.get(built.orders.q.queue_id, "orders", name)
        g_replica = replica.delivery.get(built.orders.q.queue_id, "orders", name)
        assert replica.delivery.view(g_replica, partition) == built.sm.delivery.view(
            g_source, partition
        )


def test_installed_snapshot_applies_later_commands_identically(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    built = Built(make_store())
    replica = snapshot_into(built.sm, make_store(), tmp_path / "snap")
    twin = Twin(built.sm, replica)
    orders, events = built.orders.q, built.events.q

    def lease(group: str, consumer: str, now: int, n: int = 10) -> LeaseResult:
        res = twin.one(
            cpb.LeaseCmd(
                queue="orders",
                queue_id=orders.queue_id,
                group=group,
                consumer_id=consumer,
                max_messages=n,
                lease_ms=LEASE_MS,
                now_ms=now,
            )
        )
        assert isinstance(res, LeaseResult), res
        return res

    # Dedup keys survived: the same key is still a duplicate.
    dup = twin.one(append_cmd(orders, [msg(b"a-again", 0, idempotency_key="k-a")], T0 + 100))
    assert isinstance(dup, AppendResult) and dup.duplicates == [True]
    # Timestamps keep not going back after the install (the replica's cache starts empty).
    later = twin.one(append_cmd(orders, [msg(b"e", 0), msg(b"f", 1)], T0 - 5_000))
    assert isinstance(later, AppendResult) and later.timestamps_ms == [T0, T0]
    assert values(lease("g", "c4", T0 + 200)) == [b"e", b"f"]
    twin.one(cpb.ExpireLeasesCmd(now_ms=T0 + 10 + LEASE_MS))
    again = lease("g", "c4", T0 + 6_000)
    # c1's two expired leases and the nacked message, each on its second attempt.
    assert [x.attempt for x in again.deliveries] == [2, 2, 2]
    twin.one(cpb.ApplyRetentionCmd(now_ms=T0 + 7_000))
    twin.one(append_cmd(events, [msg(b"late")], T0 + 7_000))
    twin.one(cpb.DeleteQueueCmd(name="events", now_ms=T0 + 8_000))
    twin.one(cpb.ApplyRetentionCmd(now_ms=T0 + 9_000))
    twin.one(cpb.CreateQueueCmd(config=built.events.q.config, now_ms=T0 + 10_000))
    refused = twin.one(append_cmd(events, [msg(b"stale id")], T0 + 10_000))
    assert isinstance(refused, FluxError)
    assert replica.digest() == built.sm.digest()
    assert replica.catalog == built.sm.catalog
    assert replica.last_applied_index() == built.sm.last_applied_index()


def test_leases_held_at_snapshot_time_can_be_settled_on_the_replica(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    built = Built(make_store())
    replica = snapshot_into(built.sm, make_store(), tmp_path / "snap")
    twin = Twin(built.sm, replica)
    first, second = Q.receipts(built.held)
    queue_id = built.orders.q.queue_id
    extended = twin.one(
        cpb.ExtendLeaseCmd(
            queue="orders",
            queue_id=queue_id,
            group="g",
            receipts=[first],
            now_ms=T0 + 500,
            lease_ms=LEASE_MS,
        )
    )
    assert getattr(extended, "statuses", None) == [EXTENDED]
    acked = twin.one(
        cpb.AckCmd(queue="orders", queue_id=queue_id, group="g", receipts=[second], now_ms=T0 + 600)
    )
    assert getattr(acked, "statuses", None) == [ACKED]
    assert replica.digest() == built.sm.digest()


def test_replica_that_installs_a_snapshot_catches_up_with_the_later_entries(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """Raft's flow: snapshot at index n, the leader moves on, the follower installs the
    snapshot and then applies the entries after n."""
    built = Built(make_store())
    snap_index = built.sm.write_snapshot(str(tmp_path / "snap"))
    later = [
        E(snap_index + 1, commands.encode(append_cmd(built.orders.q, [msg(b"x")], T0 + 1))),
        E(snap_index + 2, commands.encode(cpb.ExpireLeasesCmd(now_ms=T0 + 10 + LEASE_MS))),
    ]
    built.sm.apply_batch(later)
    replica = QueueStateMachine(make_store())
    replica.install_snapshot(str(tmp_path / "snap"))
    assert replica.last_applied_index() == snap_index
    assert replica.digest() != built.sm.digest()
    # Raft may resend entries the snapshot already covers: they are skipped.
    results = replica.apply_batch(
        [E(snap_index, commands.encode(cpb.ApplyRetentionCmd(now_ms=T0))), *later]
    )
    assert results[0] is None
    assert replica.digest() == built.sm.digest()


def test_install_replaces_whatever_the_replica_held(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    built = Built(make_store())
    stale = make(make_store(), "stale", partitions=3)
    stale.group("old")
    stale.publish(msg(b"old"))
    for _ in range(20):  # a replica ahead in index but on another history
        stale.retention()
    built.sm.write_snapshot(str(tmp_path / "snap"))
    stale.sm.install_snapshot(str(tmp_path / "snap"))
    assert stale.sm.catalog == built.sm.catalog
    assert stale.sm.last_applied_index() == built.sm.last_applied_index()
    assert stale.sm.digest() == built.sm.digest()
    assert "stale" not in stale.sm.catalog

    def groups(sm: QueueStateMachine) -> set[tuple[int, str, int]]:
        return {
            (queue_id, name, g.group_id)
            for queue_id, by_name in sm.delivery.groups.items()
            for name, g in by_name.items()
        }

    assert groups(stale.sm) == groups(built.sm)


def test_install_wakes_readers_of_every_log_and_group_before_and_after(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    built = Built(make_store())
    replica = make(make_store(), "replica-only", partitions=2)
    replica_group = replica.group("r")
    calls: list[tuple[list[int], list[int]]] = []
    replica.sm.commit_listener = lambda logs, groups, _pushes: calls.append((logs, groups))
    built.sm.write_snapshot(str(tmp_path / "snap"))
    replica.sm.install_snapshot(str(tmp_path / "snap"))
    (logs, groups), *rest = calls
    assert not rest
    expected_logs = {
        keys.log_id(entry.queue_id, p)
        for sm in (built.sm,)
        for entry in sm.catalog.values()
        for p in range(entry.policy.partitions)
    } | {keys.log_id(replica.q.queue_id, p) for p in range(2)}
    assert logs == sorted(expected_logs)
    expected_groups = set(built.orders.group_ids.values()) | {replica_group.group_id}
    assert groups == sorted(expected_groups)


def test_apply_batch_accepts_increasing_indexes_with_gaps(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    first = d.sm.last_applied_index()

    def entry(index: int, value: bytes) -> E:
        return E(index, commands.encode(append_cmd(q, [pb.PublishMessage(value=value)])))

    # Raft keeps no-op and membership entries to itself: the state machine sees gaps.
    results = d.sm.apply_batch([entry(first + 3, b"a"), entry(first + 7, b"b")])
    assert all(isinstance(r, AppendResult) for r in results)
    assert d.sm.last_applied_index() == first + 7
    results = d.sm.apply_batch([entry(first + 7, b"replayed"), entry(first + 10, b"c")])
    assert results[0] is None and isinstance(results[1], AppendResult)
    assert d.sm.last_applied_index() == first + 10
    assert d.records(q) == [b"a", b"b", b"c"]
    # The index survives a restart like any other.
    assert QueueStateMachine(store).last_applied_index() == first + 10


def test_digest_leaves_out_the_applied_index(store: Store) -> None:
    d = Driver(store)
    d.create()
    before = d.sm.digest()
    refused = d.one(cpb.DeleteQueueCmd(name="nope", now_ms=T0))
    assert isinstance(refused, FluxError)
    assert d.sm.digest() == before  # only the applied index moved
    d.create("other")
    assert d.sm.digest() != before


def test_lmdb_and_memory_state_machines_agree_on_the_digest(tmp_path: Path) -> None:
    lmdb_store = LmdbStore(str(tmp_path / "lmdb"), sync=False)
    memory_store = MemoryStore()
    try:
        lmdb_built, memory_built = Built(lmdb_store), Built(memory_store)
        assert lmdb_built.sm.digest() == memory_built.sm.digest()
    finally:
        lmdb_store.close()
        memory_store.close()


def test_snapshot_taken_while_another_thread_applies_matches_its_index(tmp_path: Path) -> None:
    """The copy reflects exactly the index write_snapshot returns, even with applies running
    (LMDB only: the memory twin is single-threaded)."""
    source = LmdbStore(str(tmp_path / "source"), sync=False)
    replica_store = LmdbStore(str(tmp_path / "replica"), sync=False)
    try:
        d = Driver(source)
        q = d.create()
        base = d.sm.last_applied_index()
        entries = [
            E(base + 1 + i, commands.encode(append_cmd(q, [msg(b"m%d" % i)], T0 + i)))
            for i in range(300)
        ]
        started = threading.Event()

        def apply_all() -> None:
            for n, entry in enumerate(entries):
                d.sm.apply_batch([entry])
                if n == 10:
                    started.set()

        applier = threading.Thread(target=apply_all)
        applier.start()
        try:
            assert started.wait(10)
            snap_index = d.sm.write_snapshot(str(tmp_path / "snap"))
        finally:
            applier.join()
        replica = QueueStateMachine(replica_store)
        replica.install_snapshot(str(tmp_path / "snap"))
        assert replica.last_applied_index() == snap_index
        with replica_store.read() as txn:
            high = txn.log(keys.log_id(q.queue_id, 0)).watermarks().high
        assert high == snap_index - base  # one record per applied entry
        replica.apply_batch([e for e in entries if e.index > snap_index])
        assert replica.digest() == d.sm.digest()
    finally:
        source.close()
        replica_store.close()
