"""The queue state machine, driven directly with commands (time is an input: no sleeps)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands, keys
from fluxmq.core.commands.results import AppendResult, LeaseResult, PurgeResult, RetentionResult
from fluxmq.core.errors import FluxError
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.queue_config import normalize_new, policy_of
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.core.views import DeliveryView
from storage import LmdbStore, MemoryStore, Store

T0 = 1_700_000_000_000


@dataclass(frozen=True)
class E:
    index: int
    payload: bytes


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else LmdbStore(str(tmp_path))
    yield s
    s.close()


def append_cmd(q: pb.Queue, msgs: list[pb.PublishMessage], now_ms: int = T0) -> cpb.AppendCmd:
    policy = policy_of(q.config)
    return prepare_append(q.config.name, q.queue_id, policy, msgs, 0, now_ms).command


def receipts_of(res: LeaseResult) -> list[pb.Receipt]:
    """The receipts a client would send back for the deliveries of ``res``, in their order."""
    return [
        pb.Receipt(
            partition=x.partition,
            offset=x.record.offset,
            attempt=x.attempt,
            lease_deadline_ms=x.deadline_ms,
            lease_id=x.lease_id,
            group_id=res.group_id,
        )
        for x in res.deliveries
    ]


class Driver:
    """Feeds commands with consecutive indexes, like a shard would."""

    def __init__(self, store: Store) -> None:
        self.sm = QueueStateMachine(store)
        self.index = self.sm.last_applied_index()

    def run(self, *cmds: object) -> list[object]:
        entries = []
        for cmd in cmds:
            self.index += 1
            entries.append(E(self.index, commands.encode(cmd)))
        results = self.sm.apply_batch(entries)
        # What readers see, published piece by piece, is the state built again from nothing.
        assert self.sm.view.delivery == DeliveryView.of(self.sm.delivery)
        return results

    def one(self, cmd: object) -> object:
        return self.run(cmd)[0]

    def create(self, name: str = "q", **kw: object) -> pb.Queue:
        cfg = normalize_new(pb.QueueConfig(name=name, **kw))  # type: ignore[arg-type]
        q = self.one(cpb.CreateQueueCmd(config=cfg, now_ms=T0))
        assert isinstance(q, pb.Queue)
        return q

    def append(
        self, q: pb.Queue, values: list[bytes], now_ms: int = T0, partition: int = 0, **kw: str
    ) -> object:
        msgs = [pb.PublishMessage(value=v, partition=partition, **kw) for v in values]
        return self.one(append_cmd(q, msgs, now_ms))

    def records(self, q: pb.Queue, partition: int = 0) -> list[bytes]:
        with self.sm.store.read() as txn:
            lg = txn.log(keys.log_id(q.queue_id, partition))
            wm = lg.watermarks()
            return [r.value for r in lg.read(wm.low, 100_000, 1 << 40)]

    def watermarks(self, q: pb.Queue, partition: int = 0) -> tuple[int, int]:
        with self.sm.store.read() as txn:
            wm = txn.log(keys.log_id(q.queue_id, partition)).watermarks()
            return wm.low, wm.high


def test_append_assigns_contiguous_offsets_and_leader_timestamps(store: Store) -> None:
    d = Driver(store)
    q = d.create(partitions=2)
    res = d.append(q, [b"a", b"b", b"c"])
    assert isinstance(res, AppendResult)
    assert (res.partitions, res.offsets, res.timestamps_ms) == ([0] * 3, [0, 1, 2], [T0] * 3)
    assert d.records(q) == [b"a", b"b", b"c"]


def test_timestamps_of_a_partition_never_go_back_when_the_clock_does(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    d.append(q, [b"a"], now_ms=T0 + 500)
    res = d.append(q, [b"b"], now_ms=T0)  # the leader's clock stepped back
    assert isinstance(res, AppendResult)
    assert res.timestamps_ms == [T0 + 500]


def test_creating_an_existing_queue_is_refused_and_changes_nothing(store: Store) -> None:
    d = Driver(store)
    d.create("dup")
    err = d.one(cpb.CreateQueueCmd(config=normalize_new(pb.QueueConfig(name="dup")), now_ms=T0))
    assert isinstance(err, FluxError) and err.reason == "QUEUE_EXISTS"
    assert len(d.sm.catalog) == 1


def test_refused_command_does_not_abort_the_rest_of_its_batch(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    good = append_cmd(q, [pb.PublishMessage(value=b"ok")])
    bad = append_cmd(q, [pb.PublishMessage(value=b"lost?")])
    bad.queue, bad.queue_id = "nope", 99
    r_bad, r_good = d.run(bad, good)
    assert isinstance(r_bad, FluxError) and r_bad.reason == "QUEUE_NOT_FOUND"
    assert isinstance(r_good, AppendResult)
    assert d.records(q) == [b"ok"]


def test_append_to_a_recreated_queue_with_the_old_id_is_rejected(store: Store) -> None:
    d = Driver(store)
    old = d.create()
    d.one(cpb.DeleteQueueCmd(name="q", now_ms=T0))
    new = d.create()
    assert new.queue_id != old.queue_id
    err = d.append(old, [b"stale"])
    assert isinstance(err, FluxError) and err.reason == "QUEUE_NOT_FOUND"
    assert d.records(new) == []


def test_repeated_idempotency_key_inside_window_is_a_duplicate_and_writes_nothing(
    store: Store,
) -> None:
    d = Driver(store)
    q = d.create(dedup_window="1m")
    first = d.append(q, [b"x"], idempotency_key="k1")
    again = d.append(q, [b"x-again"], now_ms=T0 + 59_999, idempotency_key="k1")
    assert isinstance(first, AppendResult) and isinstance(again, AppendResult)
    assert again.duplicates == [True]
    assert (again.partitions, again.offsets) == ([0], [0])
    assert again.timestamps_ms == first.timestamps_ms
    assert d.records(q) == [b"x"]


def test_idempotency_key_outside_window_is_a_new_record(store: Store) -> None:
    d = Driver(store)
    q = d.create(dedup_window="1m")
    d.append(q, [b"x"], idempotency_key="k1")
    later = d.append(q, [b"y"], now_ms=T0 + 60_000, idempotency_key="k1")
    assert isinstance(later, AppendResult) and later.duplicates == [False]
    assert later.offsets == [1]
    # ... and the new write opens a new window.
    again = d.append(q, [b"z"], now_ms=T0 + 60_001, idempotency_key="k1")
    assert isinstance(again, AppendResult) and again.duplicates == [True]
    assert again.offsets == [1]
    assert d.records(q) == [b"x", b"y"]


def test_duplicate_keys_inside_one_publish_store_one_record(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    cmd = append_cmd(
        q,
        [
            pb.PublishMessage(value=b"a", idempotency_key="same"),
            pb.PublishMessage(value=b"b"),
            pb.PublishMessage(value=b"a2", idempotency_key="same"),
        ],
    )
    res = d.one(cmd)
    assert isinstance(res, AppendResult)
    assert list(zip(res.offsets, res.duplicates, strict=True)) == [
        (0, False),
        (1, False),
        (0, True),
    ]
    assert d.records(q) == [b"a", b"b"]


def test_expired_dedup_keys_are_removed_by_retention(store: Store) -> None:
    d = Driver(store)
    q = d.create(dedup_window="1s")
    d.append(q, [b"x"], idempotency_key="k")
    res = d.one(cpb.ApplyRetentionCmd(now_ms=T0 + 999))
    assert isinstance(res, RetentionResult) and res.expired_dedup_keys == 0
    res = d.one(cpb.ApplyRetentionCmd(now_ms=T0 + 1000))
    assert isinstance(res, RetentionResult) and res.expired_dedup_keys == 1
    with store.read() as txn:
        assert txn.get(keys.dedup_key(q.queue_id, "k")) is None


def test_replayed_entries_change_nothing(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    raw = commands.encode(append_cmd(q, [pb.PublishMessage(value=b"once")]))
    d.sm.apply_batch([E(2, raw)])
    # A restart re-delivers entries 1..2: both are at or below the applied index.
    sm2 = QueueStateMachine(store)
    assert sm2.last_applied_index() == 2
    results = sm2.apply_batch([E(1, commands.encode(cpb.ApplyRetentionCmd(now_ms=T0))), E(2, raw)])
    assert results == [None, None]
    assert d.records(q) == [b"once"]


def test_failed_transaction_leaves_catalog_and_applied_index_untouched(store: Store) -> None:
    d = Driver(store)
    d.create("a")
    before = d.sm.last_applied_index()
    with pytest.raises(commands.UnknownCommandError):
        d.sm.apply_batch(
            [
                E(
                    before + 1,
                    commands.encode(
                        cpb.CreateQueueCmd(
                            config=normalize_new(pb.QueueConfig(name="b")), now_ms=T0
                        )
                    ),
                ),
                E(before + 2, b"\xfe garbage"),
            ]
        )
    assert d.sm.last_applied_index() == before
    assert set(d.sm.catalog) == {"a"}
    assert set(QueueStateMachine(store).catalog) == {"a"}


def test_retention_by_count_moves_low_watermark(store: Store) -> None:
    d = Driver(store)
    q = d.create(retention=pb.Retention(max_messages=3))
    d.append(q, [b"%d" % i for i in range(10)])
    d.one(cpb.ApplyRetentionCmd(now_ms=T0))
    assert d.watermarks(q) == (7, 10)
    assert d.records(q) == [b"7", b"8", b"9"]


def test_retention_by_age_removes_only_older_records(store: Store) -> None:
    d = Driver(store)
    q = d.create(retention=pb.Retention(max_age="10s"))
    d.append(q, [b"old1", b"old2"], now_ms=T0)
    d.append(q, [b"new"], now_ms=T0 + 5_000)
    d.one(cpb.ApplyRetentionCmd(now_ms=T0 + 10_000))  # old ones are exactly 10s old
    assert d.records(q) == [b"new"]
    assert d.watermarks(q) == (2, 3)


def test_retention_by_bytes_keeps_partition_under_limit(store: Store) -> None:
    d = Driver(store)
    q = d.create(retention=pb.Retention(max_bytes="2KiB"))
    for i in range(10):  # ten publishes: ten batches of one record
        d.append(q, [bytes([i]) * 500])
    d.one(cpb.ApplyRetentionCmd(now_ms=T0))
    with store.read() as txn:
        lg = txn.log(keys.log_id(q.queue_id, 0))
        assert lg.size_bytes() <= 2048
        low = lg.watermarks().low
        kept = lg.batch_headers(low, 100)
    assert 5 <= low < 10
    # One more batch than kept would exceed the limit: the cut is as small as possible.
    assert len(d.records(q)) == 10 - low
    assert sum(h.size_bytes for h in kept) + 500 > 2048


def test_retention_by_bytes_removes_whole_batches(store: Store) -> None:
    d = Driver(store)
    q = d.create(retention=pb.Retention(max_bytes="2KiB"))
    d.append(q, [bytes([i]) * 500 for i in range(10)])  # one batch of 5 KB
    d.append(q, [b"small"])
    d.one(cpb.ApplyRetentionCmd(now_ms=T0))
    # The batch over the limit goes whole; none of its records is left half-kept.
    assert d.records(q) == [b"small"]
    assert d.watermarks(q) == (10, 11)


def test_purge_empties_every_partition(store: Store) -> None:
    d = Driver(store)
    q = d.create(partitions=2)
    d.append(q, [b"a", b"b"], partition=0)
    d.append(q, [b"c"], partition=1)
    purged = d.one(cpb.PurgeCmd(name="q", queue_id=q.queue_id, now_ms=T0))
    assert isinstance(purged, PurgeResult) and purged.purged_records == 3
    assert d.watermarks(q, 0) == (2, 2) and d.watermarks(q, 1) == (1, 1)


def test_deleted_queue_records_are_dropped_by_retention_passes(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    d.append(q, [b"x"] * 20)
    d.one(cpb.DeleteQueueCmd(name="q", now_ms=T0))
    d.one(cpb.ApplyRetentionCmd(now_ms=T0))
    with store.read() as txn:
        assert txn.log(keys.log_id(q.queue_id, 0)).watermarks().high == 0
        assert list(txn.scan(keys.TRASH)) == []


def test_update_can_grow_partitions_but_not_shrink(store: Store) -> None:
    d = Driver(store)
    q = d.create(partitions=2)
    cfg = pb.QueueConfig()
    cfg.CopyFrom(q.config)
    cfg.partitions = 4
    version = {"queue_id": q.queue_id, "expected_updated_at_ms": q.updated_at_ms}
    updated = d.one(cpb.UpdateQueueCmd(config=cfg, now_ms=T0 + 1, **version))
    assert isinstance(updated, pb.Queue) and updated.config.partitions == 4
    cfg.partitions = 3
    version["expected_updated_at_ms"] = updated.updated_at_ms
    err = d.one(cpb.UpdateQueueCmd(config=cfg, now_ms=T0 + 2, **version))
    assert isinstance(err, FluxError)


def test_racing_updates_cannot_silently_undo_each_other(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    first, second = pb.QueueConfig(), pb.QueueConfig()
    first.CopyFrom(q.config)
    second.CopyFrom(q.config)
    first.labels["team"] = "a"
    second.retention.max_messages = 100
    # Both were merged into the same version of the queue; only the first may apply.
    version = {"queue_id": q.queue_id, "expected_updated_at_ms": q.updated_at_ms}
    won = d.one(cpb.UpdateQueueCmd(config=first, now_ms=T0, **version))
    lost = d.one(cpb.UpdateQueueCmd(config=second, now_ms=T0, **version))
    assert isinstance(won, pb.Queue) and dict(won.config.labels) == {"team": "a"}
    assert isinstance(lost, FluxError) and lost.reason == "CONCURRENT_UPDATE" and lost.retriable
    assert dict(d.sm.catalog["q"].queue.config.labels) == {"team": "a"}


def _twins() -> tuple[Driver, Driver]:
    return Driver(MemoryStore()), Driver(MemoryStore())


def test_retention_budget_is_spent_identically_by_a_restarted_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fluxmq.core import limits

    monkeypatch.setattr(limits, "RETENTION_RECORDS_PER_PASS_MAX", 10)
    a, b = _twins()
    for d in (a, b):
        for name in ("zzz", "aaa"):  # creation order differs from name order
            q = d.create(name, retention=pb.Retention(max_messages=1))
            d.append(q, [b"x"] * 10)
    b.sm = QueueStateMachine(b.sm.store)  # b restarts: its catalog is rebuilt from storage
    for d in (a, b):
        d.one(cpb.ApplyRetentionCmd(now_ms=T0))
    lows = [{n: d.watermarks(d.sm.catalog[n].queue)[0] for n in ("aaa", "zzz")} for d in (a, b)]
    assert lows[0] == lows[1]


def test_timestamp_after_an_emptied_log_is_the_same_on_a_restarted_replica() -> None:
    a, b = _twins()
    stamps = []
    for d in (a, b):
        q = d.create()
        d.append(q, [b"x"], now_ms=T0 + 5000)
        d.one(cpb.PurgeCmd(name="q", queue_id=q.queue_id, now_ms=T0 + 5000))
    b.sm = QueueStateMachine(b.sm.store)
    for d in (a, b):
        res = d.append(d.sm.catalog["q"].queue, [b"y"], now_ms=T0 + 4000)  # clock stepped back
        assert isinstance(res, AppendResult)
        stamps.append(res.timestamps_ms)
    assert stamps[0] == stamps[1]
