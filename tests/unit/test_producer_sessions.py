"""Idempotent producer sessions in the state machine (core/producers.py), on both stores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, producers
from fluxmq.core.commands.results import AppendResult, RetentionResult
from fluxmq.core.errors import FluxError
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.producers import ProducerGrant
from fluxmq.core.queue_config import policy_of
from storage import LmdbStore, MemoryStore, Store
from tests.unit.test_state_machine import T0, Driver


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else LmdbStore(str(tmp_path))
    yield s
    s.close()


def session_cmd(
    q: pb.Queue,
    grant: ProducerGrant,
    first_sequence: int,
    values: list[bytes],
    partition: int = 0,
    now_ms: int = T0,
    epoch: int | None = None,
) -> cpb.AppendCmd:
    msgs = [pb.PublishMessage(value=v, partition=partition) for v in values]
    session = pb.ProducerSession(
        producer_id=grant.producer_id,
        producer_epoch=grant.producer_epoch if epoch is None else epoch,
        first_sequence=first_sequence,
    )
    policy = policy_of(q.config)
    return prepare_append(q.config.name, q.queue_id, policy, msgs, 0, now_ms, session).command


def init(d: Driver, q: pb.Queue, name: str = "", now_ms: int = T0) -> ProducerGrant:
    grant = d.one(
        cpb.InitProducerCmd(
            queue=q.config.name, queue_id=q.queue_id, now_ms=now_ms, producer_name=name
        )
    )
    assert isinstance(grant, ProducerGrant)
    return grant


def stored_values(d: Driver, q: pb.Queue, partition: int = 0) -> list[bytes]:
    with d.sm.store.read() as txn:
        log = txn.log(keys.log_id(q.queue_id, partition))
        wm = log.watermarks()
        return [r.value for r in log.read(wm.low, 10_000, 1 << 30)] if wm.high > wm.low else []


def test_retried_request_is_answered_with_its_first_offsets_and_stored_once(store: Store) -> None:
    d = Driver(store)
    q = d.create(partitions=2)
    g = init(d, q)
    first = d.one(session_cmd(q, g, 0, [b"a", b"b"], partition=1))
    second = d.one(session_cmd(q, g, 2, [b"c"], partition=1))
    again = d.one(session_cmd(q, g, 0, [b"a", b"b"], partition=1, now_ms=T0 + 5000))
    assert isinstance(first, AppendResult) and isinstance(again, AppendResult)
    assert isinstance(second, AppendResult)
    assert again.offsets == first.offsets == [0, 1]
    assert again.timestamps_ms == first.timestamps_ms
    assert again.duplicates == [True, True] and first.duplicates == [False, False]
    assert stored_values(d, q, 1) == [b"a", b"b", b"c"]


def test_gap_in_sequence_is_refused_as_retriable_and_stores_nothing(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    g = init(d, q)
    d.one(session_cmd(q, g, 0, [b"a"]))
    gap = d.one(session_cmd(q, g, 5, [b"x"]))
    assert isinstance(gap, FluxError) and gap.reason == "OUT_OF_ORDER_SEQUENCE"
    assert gap.retriable and gap.metadata["expected_sequence"] == "1"
    assert stored_values(d, q) == [b"a"]


def test_first_request_of_a_session_must_start_at_zero(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    g = init(d, q)
    res = d.one(session_cmd(q, g, 3, [b"a"]))
    assert isinstance(res, FluxError) and res.reason == "OUT_OF_ORDER_SEQUENCE"


def test_retry_with_another_message_count_is_refused(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    g = init(d, q)
    d.one(session_cmd(q, g, 0, [b"a", b"b"]))
    res = d.one(session_cmd(q, g, 0, [b"a"]))
    assert isinstance(res, FluxError) and res.reason == "INVALID_ARGUMENT"
    assert res.violations[0].field == "producer.first_sequence"


def test_sequence_older_than_the_remembered_requests_is_refused(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    g = init(d, q)
    for seq in range(producers.BATCHES_REMEMBERED + 1):
        assert isinstance(d.one(session_cmd(q, g, seq, [b"v%d" % seq])), AppendResult)
    res = d.one(session_cmd(q, g, 0, [b"v0"]))
    assert isinstance(res, FluxError) and res.reason == "INVALID_ARGUMENT"
    last = d.one(session_cmd(q, g, producers.BATCHES_REMEMBERED, [b"v5"]))
    assert isinstance(last, AppendResult) and last.duplicates == [True]


def test_sequences_are_per_partition(store: Store) -> None:
    d = Driver(store)
    q = d.create(partitions=3)
    g = init(d, q)
    for p in range(3):
        res = d.one(session_cmd(q, g, 0, [b"p%d" % p], partition=p))
        assert isinstance(res, AppendResult) and res.duplicates == [False]


def test_stale_epoch_is_fenced_after_a_named_producer_restarts(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    old = init(d, q, "billing")
    d.one(session_cmd(q, old, 0, [b"a"]))
    new = init(d, q, "billing")
    assert new.producer_id == old.producer_id and new.producer_epoch == old.producer_epoch + 1
    zombie = d.one(session_cmd(q, old, 1, [b"zombie"]))
    assert isinstance(zombie, FluxError) and zombie.reason == "PRODUCER_FENCED"
    assert not zombie.retriable
    # The new epoch starts its sequences again.
    res = d.one(session_cmd(q, new, 0, [b"b"]))
    assert isinstance(res, AppendResult) and res.offsets == [1]
    assert stored_values(d, q) == [b"a", b"b"]


def test_anonymous_producers_get_distinct_ids(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    a, b = init(d, q), init(d, q)
    assert a.producer_id != b.producer_id and a.producer_epoch == b.producer_epoch == 0


def test_epoch_never_granted_is_refused(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    g = init(d, q)
    res = d.one(session_cmd(q, g, 0, [b"a"], epoch=3))
    assert isinstance(res, FluxError) and res.reason == "INVALID_ARGUMENT"
    assert res.violations[0].field == "producer.producer_epoch"


def test_unknown_producer_is_refused(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    res = d.one(session_cmd(q, ProducerGrant(99, 0), 0, [b"a"]))
    assert isinstance(res, FluxError) and res.reason == "UNKNOWN_PRODUCER"
    assert stored_values(d, q) == []


def test_idle_producer_state_expires_and_active_one_stays(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    idle = init(d, q, "idle")
    busy = init(d, q)
    d.one(session_cmd(q, idle, 0, [b"a"]))
    later = T0 + producers.IDLE_EXPIRY_MS - 1000
    d.one(session_cmd(q, busy, 0, [b"b"], now_ms=later))
    res = d.one(cpb.ApplyRetentionCmd(now_ms=T0 + producers.IDLE_EXPIRY_MS + 1))
    assert isinstance(res, RetentionResult) and res.expired_producers == 1
    gone = d.one(session_cmd(q, idle, 1, [b"c"], now_ms=T0 + producers.IDLE_EXPIRY_MS + 2))
    assert isinstance(gone, FluxError) and gone.reason == "UNKNOWN_PRODUCER"
    kept = d.one(session_cmd(q, busy, 1, [b"d"], now_ms=later + 10))
    assert isinstance(kept, AppendResult)
    # The name is free again: a new id, epoch 0.
    again = init(d, q, "idle", now_ms=T0 + producers.IDLE_EXPIRY_MS + 3)
    assert again.producer_id not in (idle.producer_id, busy.producer_id)
    assert again.producer_epoch == 0


def test_expiry_pass_is_bounded_and_resumes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producers, "EXPIRY_ROWS_PER_PASS_MAX", 3)
    d = Driver(store)
    q = d.create()
    for _ in range(7):
        init(d, q)
    now = T0 + producers.IDLE_EXPIRY_MS + 1
    counts = []
    for _ in range(4):
        res = d.one(cpb.ApplyRetentionCmd(now_ms=now))
        assert isinstance(res, RetentionResult)
        counts.append(res.expired_producers)
    assert counts == [3, 3, 1, 0]


def test_producers_of_a_deleted_queue_are_forgotten(store: Store) -> None:
    d = Driver(store)
    q = d.create()
    init(d, q, "named")
    d.one(cpb.DeleteQueueCmd(name="q", now_ms=T0))
    res = d.one(cpb.ApplyRetentionCmd(now_ms=T0 + 1))
    assert isinstance(res, RetentionResult) and res.expired_producers == 1
    with d.sm.store.read() as txn:
        assert list(txn.scan(keys.PRODUCER)) == [] and list(txn.scan(keys.PRODUCER_NAME)) == []


def test_session_request_naming_two_partitions_is_refused() -> None:
    q = pb.Queue(queue_id=1, config=pb.QueueConfig(name="q", partitions=2))
    msgs = [pb.PublishMessage(value=b"a", partition=0), pb.PublishMessage(value=b"b", partition=1)]
    session = pb.ProducerSession(producer_id=1, producer_epoch=0, first_sequence=0)
    with pytest.raises(FluxError) as err:
        prepare_append("q", 1, policy_of(q.config), msgs, 0, T0, session)
    assert err.value.violations[0].field == "messages[1].partition"


def test_session_request_with_idempotency_key_is_refused() -> None:
    q = pb.Queue(queue_id=1, config=pb.QueueConfig(name="q", partitions=1))
    msgs = [pb.PublishMessage(value=b"a", partition=0, idempotency_key="k")]
    session = pb.ProducerSession(producer_id=1, producer_epoch=0, first_sequence=0)
    with pytest.raises(FluxError) as err:
        prepare_append("q", 1, policy_of(q.config), msgs, 0, T0, session)
    assert err.value.violations[0].field == "messages[0].idempotency_key"


def test_session_state_is_in_the_digest_and_equal_on_replicas(tmp_path: object) -> None:
    digests = []
    for s in (MemoryStore(), LmdbStore(str(tmp_path))):
        d = Driver(s)
        q = d.create()
        g = init(d, q, "p")
        d.one(session_cmd(q, g, 0, [b"a"]))
        d.one(session_cmd(q, g, 0, [b"a"]))
        digests.append(d.sm.digest())
        s.close()
    assert digests[0] == digests[1]


def test_request_stored_before_its_epoch_was_fenced_is_still_answered_as_a_retry(
    store: Store,
) -> None:
    d = Driver(store)
    q = d.create()
    old = init(d, q, "sdk")
    first = d.one(session_cmd(q, old, 0, [b"a", b"b"]))
    assert isinstance(first, AppendResult)
    new = init(d, q, "sdk")  # the producer moved to the next epoch (its answer was lost)
    again = d.one(session_cmd(q, old, 0, [b"a", b"b"]))
    assert isinstance(again, AppendResult)
    assert again.offsets == first.offsets and again.duplicates == [True, True]
    # A request of the old epoch that was not stored is fenced (and never will be stored).
    fenced = d.one(session_cmd(q, old, 2, [b"c"]))
    assert isinstance(fenced, FluxError) and fenced.reason == "PRODUCER_FENCED"
    assert stored_values(d, q) == [b"a", b"b"]
    res = d.one(session_cmd(q, new, 0, [b"c"]))
    assert isinstance(res, AppendResult) and res.offsets == [2]
