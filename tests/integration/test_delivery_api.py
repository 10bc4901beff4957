"""Consumer groups end to end over real gRPC: leases, retries, dead letters, fan-out, offsets,
ordered mode, filters, Consume streams, transactions, purge scopes, stats and metrics.

One node serves the whole module (every test uses its own queues): starting a node per test
would cost more than the tests themselves. Lease expiry runs on the leader's 100 ms timer, so the
tests use leases of a few hundred ms and bounded waits."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .delivery_helpers import (
    ACKED,
    ALREADY_ACKED,
    DEAD_LETTERED,
    NACKED,
    STALE,
    Stub,
    ack,
    dead_letters,
    describe,
    group,
    lease,
    lease_all,
    nack,
    publish,
    receipts,
    scrape,
    total,
    values,
    wait_for,
    work_queue,
)
from .rpc_helpers import rich_error


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(Path(tmp_path_factory.mktemp("delivery")) / "node")
    n.start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def stub(node: Node) -> Iterator[Stub]:
    with node.channel() as ch:
        yield queue_pb2_grpc.QueueServiceStub(ch)


def by_offset(messages: list[pb.LeasedMessage]) -> list[pb.LeasedMessage]:
    return sorted(messages, key=lambda m: (m.receipt.partition, m.receipt.offset))


# -- leases, retries, dead letters ---------------------------------------------------------


def test_lease_timeout_redelivers_with_attempt_plus_one(stub: Stub) -> None:
    work_queue(stub, "expire")
    group(stub, "expire")
    publish(stub, "expire", b"job")
    (first,) = lease(stub, "expire", consumer="a", lease_ms=300)
    assert first.receipt.attempt == 1 and first.record.value == b"job"
    assert lease(stub, "expire", consumer="b", n=10) == []  # leased to a until its deadline
    started = time.monotonic()
    (again,) = lease(stub, "expire", consumer="b", lease_ms=30_000, wait_ms=5_000)
    waited = time.monotonic() - started
    r0, r1 = first.receipt, again.receipt
    assert (r1.partition, r1.offset, r1.attempt) == (r0.partition, r0.offset, 2)
    assert r1.lease_id != r0.lease_id and r1.lease_deadline_ms > r0.lease_deadline_ms
    assert again.record.value == b"job"
    assert waited < 3, f"the long poll was not woken by the expiry ({waited:.2f}s)"
    assert dict(describe(stub, "expire").in_flight_by_consumer) == {"b": 1}


def test_ack_after_redelivery_old_receipt_is_stale_new_receipt_acked(stub: Stub) -> None:
    work_queue(stub, "redeliver")
    group(stub, "redeliver")
    publish(stub, "redeliver", b"once")
    (old,) = lease(stub, "redeliver", consumer="slow", lease_ms=200)
    (new,) = lease_all(stub, "redeliver", consumer="fast", count=1)
    assert (new.receipt.offset, new.receipt.attempt) == (old.receipt.offset, 2)
    # The slow consumer comes back after its lease expired: its ack changes nothing.
    assert ack(stub, "redeliver", "g", [old.receipt]) == [STALE]
    assert dict(describe(stub, "redeliver").in_flight_by_consumer) == {"fast": 1}
    assert ack(stub, "redeliver", "g", [new.receipt]) == [ACKED]
    assert ack(stub, "redeliver", "g", [old.receipt, new.receipt]) == [ALREADY_ACKED] * 2
    desc = describe(stub, "redeliver")
    assert (total(desc, "acked"), total(desc, "lag"), total(desc, "in_flight")) == (1, 0, 0)


def test_max_attempts_exceeded_dead_letters_with_fluxmq_headers_and_group(stub: Stub) -> None:
    work_queue(stub, "poison", partitions=2, max_attempts=2)
    group(stub, "poison", "workers")
    (res,) = publish(stub, "poison", b"bad", key=b"k1", headers={"trace": b"t-1"})
    for attempt in (1, 2):
        got = lease_all(stub, "poison", "workers", count=1, lease_ms=200)
        assert [m.receipt.attempt for m in got] == [attempt]
    # The second lease expires too: no attempts left, so the message is dead-lettered.
    (dl,) = wait_for(lambda: dead_letters(stub, "poison"), what="the dead letter")
    assert (dl.group, dl.reason, dl.attempts) == ("workers", "max_attempts", 2)
    assert (dl.original_partition, dl.original_offset) == (res.partition, res.offset)
    assert dl.dead_at_ms >= res.timestamp_ms
    assert (dl.record.value, dl.record.key) == (b"bad", b"k1")
    headers = dict(dl.record.headers)
    assert headers["trace"] == b"t-1"  # the message's own headers are kept
    assert {k: v for k, v in headers.items() if k.startswith("fluxmq-")} == {
        "fluxmq-original-queue": b"poison",
        "fluxmq-original-partition": b"%d" % res.partition,
        "fluxmq-original-offset": b"%d" % res.offset,
        "fluxmq-original-timestamp": b"%d" % res.timestamp_ms,
        "fluxmq-attempts": b"2",
        "fluxmq-dead-reason": b"max_attempts",
        "fluxmq-dead-at": b"%d" % dl.dead_at_ms,
        "fluxmq-group": b"workers",
    }
    assert dead_letters(stub, "poison", "other") == []  # the group filter of the listing
    assert lease(stub, "poison", "workers", n=10, wait_ms=300) == []  # never redelivered
    desc = describe(stub, "poison", "workers")
    assert (total(desc, "dead"), total(desc, "lag"), total(desc, "in_flight")) == (1, 0, 0)
    dlq = stub.GetQueue(pb.GetQueueRequest(name="poison.dlq"))
    assert dlq.dead_letter_of == "poison"


def test_nack_dead_sends_the_message_straight_to_the_dead_letter_queue(stub: Stub) -> None:
    work_queue(stub, "reject", max_attempts=10)
    group(stub, "reject")
    publish(stub, "reject", b"unparseable", b"fine")
    (m,) = lease(stub, "reject", lease_ms=30_000)
    assert m.record.value == b"unparseable"
    assert nack(stub, "reject", "g", [m.receipt], dead=True, reason="bad json") == [DEAD_LETTERED]
    (dl,) = dead_letters(stub, "reject")
    assert (dl.group, dl.reason, dl.attempts, dl.record.value) == (
        "g",
        "bad json",
        1,
        m.record.value,
    )
    assert dict(dl.record.headers)["fluxmq-dead-reason"] == b"bad json"
    # Only the other message is left; the dead one is done for the group.
    assert values(lease(stub, "reject", n=10)) == [b"fine"]
    assert lease(stub, "reject", n=10) == []
    assert ack(stub, "reject", "g", [m.receipt]) == [ALREADY_ACKED]


def test_replayed_dead_letter_is_leased_again_with_attempt_1(stub: Stub) -> None:
    work_queue(stub, "replay", partitions=2)
    group(stub, "replay")
    group(stub, "replay", "audit")
    (orig,) = publish(stub, "replay", b"retry-me", key=b"k", headers={"h": b"1"})
    (a,) = lease(stub, "replay", "audit")
    assert ack(stub, "replay", "audit", [a.receipt]) == [ACKED]
    (m,) = lease(stub, "replay", lease_ms=30_000)
    assert nack(stub, "replay", "g", [m.receipt], dead=True, reason="later") == [DEAD_LETTERED]
    (dl,) = dead_letters(stub, "replay")
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="replay")).dead_letters == 1

    req = pb.ReplayDeadLettersRequest(queue="replay", ids=[dl.id])
    assert stub.ReplayDeadLetters(req).replayed == 1
    assert dead_letters(stub, "replay") == []
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="replay")).dead_letters == 0
    (again,) = lease_all(stub, "replay", count=1)
    assert (again.record.value, again.record.key) == (b"retry-me", b"k")
    assert again.receipt.attempt == 1
    assert again.receipt.partition == orig.partition and again.receipt.offset > orig.offset
    assert dict(again.record.headers)["h"] == b"1"
    assert ack(stub, "replay", "g", [again.receipt]) == [ACKED]
    # The replay is aimed at the group that dead-lettered it: audit is done with the message.
    assert lease(stub, "replay", "audit", n=10) == []
    assert total(describe(stub, "replay", "audit"), "lag") == 0


# -- consumers ------------------------------------------------------------------------------


def test_duplicate_consumer_id_is_refused_while_its_long_poll_runs(stub: Stub) -> None:
    work_queue(stub, "busy")
    group(stub, "busy")
    outcome: dict[str, object] = {}

    def poll() -> None:
        try:
            outcome["got"] = lease(stub, "busy", consumer="w1", wait_ms=10_000)
        except grpc.RpcError as err:  # pragma: no cover - reported below
            outcome["error"] = err

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)  # the poll is now waiting on the server
    try:
        with pytest.raises(grpc.RpcError) as info:
            lease(stub, "busy", consumer="w1")
        e = rich_error(info.value)
        assert (e.code, e.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "CONSUMER_BUSY")
        assert e.metadata["consumer_id"] == "w1" and e.metadata["retriable"] == "true"
        # A Consume stream with the same id is refused as well; other ids are fine.
        stream = stub.Consume(
            pb.ConsumeRequest(queue="busy", group="g", consumer_id="w1"), timeout=5
        )
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
        assert rich_error(info.value).reason == "CONSUMER_BUSY"
        assert lease(stub, "busy", consumer="w2") == []
    finally:
        publish(stub, "busy", b"wake")  # ends the long poll
        poller.join(10)
    assert not poller.is_alive() and "error" not in outcome, outcome
    assert values(outcome["got"]) == [b"wake"]  # type: ignore[arg-type]
    # The poll returned: the id is free again.
    publish(stub, "busy", b"next")
    assert values(lease(stub, "busy", consumer="w1")) == [b"next"]


def test_every_group_gets_every_message_and_members_share_a_group(stub: Stub) -> None:
    work_queue(stub, "fan", partitions=3)
    names = ["billing", "email", "audit"]
    for name in names:
        group(stub, "fan", name)
    sent = [b"m%02d" % i for i in range(12)]
    publish(stub, "fan", *sent)
    for name in names:
        # Two members of the group compete: together they get each message once.
        first = lease(stub, "fan", name, consumer="a", n=6)
        second = lease(stub, "fan", name, consumer="b", n=100)
        got = values(first) + values(second)
        assert sorted(got) == sent, name
        assert {m.receipt.attempt for m in first + second} == {1}
        assert ack(stub, "fan", name, receipts(first + second)) == [ACKED] * 12
        assert lease(stub, "fan", name, n=100) == []
    lags = stub.GetQueueStats(pb.GetQueueStatsRequest(name="fan")).groups
    assert sorted((g.name, g.lag, g.in_flight) for g in lags) == sorted((n, 0, 0) for n in names)


def test_group_created_at_latest_sees_only_new_messages(stub: Stub) -> None:
    work_queue(stub, "late", partitions=2)
    publish(stub, "late", b"old1", b"old2", b"old3")
    group(stub, "late", "new-only", start=pb.StartPosition(latest=True))
    group(stub, "late", "everything")
    assert lease(stub, "late", "new-only", n=10) == []
    publish(stub, "late", b"new1", b"new2")
    got = lease_all(stub, "late", "new-only", count=2)
    assert sorted(values(got)) == [b"new1", b"new2"]
    assert lease(stub, "late", "new-only", n=10) == []
    assert len(lease_all(stub, "late", "everything", count=5)) == 5


def test_reset_offsets_to_a_timestamp_replays_from_there(stub: Stub) -> None:
    work_queue(stub, "rewind")
    group(stub, "rewind")
    publish(stub, "rewind", b"a0", b"a1")
    time.sleep(0.02)
    later = publish(stub, "rewind", b"b0", b"b1")
    done = lease_all(stub, "rewind", count=4)
    assert ack(stub, "rewind", "g", receipts(done)) == [ACKED] * 4
    resp = stub.ResetOffsets(
        pb.ResetOffsetsRequest(
            queue="rewind", group="g", to=pb.StartPosition(timestamp_ms=later[0].timestamp_ms)
        )
    )
    assert [(p.partition, p.committed, p.latest, p.lag) for p in resp.partitions] == [(0, 2, 4, 2)]
    again = by_offset(lease_all(stub, "rewind", count=2))
    assert values(again) == [b"b0", b"b1"]
    assert [m.receipt.attempt for m in again] == [1, 1]
    assert lease(stub, "rewind", n=10) == []
    assert ack(stub, "rewind", "g", receipts(again)) == [ACKED] * 2


def test_reset_offsets_drops_leases_and_their_receipts_are_stale(stub: Stub) -> None:
    """QueueService docs: RECEIPT_STATUS_STALE = the lease is gone (... or offsets were reset)."""
    work_queue(stub, "rewind2")
    group(stub, "rewind2")
    publish(stub, "rewind2", b"x0", b"x1")
    held = lease(stub, "rewind2", n=2, lease_ms=30_000)
    stub.ResetOffsets(
        pb.ResetOffsetsRequest(queue="rewind2", group="g", to=pb.StartPosition(earliest=True))
    )
    assert dict(describe(stub, "rewind2").in_flight_by_consumer) == {}
    assert ack(stub, "rewind2", "g", receipts(held)) == [STALE, STALE]
    again = by_offset(lease(stub, "rewind2", n=2))
    assert [m.receipt.attempt for m in again] == [1, 1]
    assert ack(stub, "rewind2", "g", receipts(held)) == [STALE, STALE]


def test_ordered_group_holds_a_partition_for_one_consumer_at_a_time(stub: Stub) -> None:
    work_queue(stub, "ordered", partitions=2)
    group(stub, "ordered", mode=pb.DELIVERY_MODE_ORDERED)
    for p in (0, 1):
        publish(stub, "ordered", *[b"p%d-%d" % (p, i) for i in range(4)], partition=p)

    a = lease(stub, "ordered", consumer="a", n=2, lease_ms=30_000)
    (pa,) = {m.receipt.partition for m in a}
    assert [m.receipt.offset for m in a] == [0, 1]
    # b gets the other partition only, in offset order; a's partition is held.
    b = lease(stub, "ordered", consumer="b", n=10, lease_ms=30_000)
    assert {m.receipt.partition for m in b} == {1 - pa}
    assert [m.receipt.offset for m in b] == [0, 1, 2, 3]
    # Both partitions are held: nobody gets anything, not even the holders.
    assert lease(stub, "ordered", consumer="c", n=10) == []
    assert lease(stub, "ordered", consumer="a", n=10) == []

    assert ack(stub, "ordered", "g", receipts(a)) == [ACKED] * 2
    c = lease(stub, "ordered", consumer="c", n=10, lease_ms=30_000)
    assert [(m.receipt.partition, m.receipt.offset) for m in c] == [(pa, 2), (pa, 3)]
    # A nacked batch comes back first and in order, before anything later.
    assert nack(stub, "ordered", "g", receipts(c), retry_after_ms=100) == [NACKED] * 2
    d = lease_all(stub, "ordered", consumer="d", count=2)
    assert [(m.receipt.offset, m.receipt.attempt) for m in d] == [(2, 2), (3, 2)]
    assert ack(stub, "ordered", "g", receipts(d) + receipts(b)) == [ACKED] * 6
    assert total(describe(stub, "ordered"), "lag") == 0


def test_group_filter_skips_non_matching_messages_and_counts_them(stub: Stub) -> None:
    work_queue(stub, "filtered", partitions=2)
    group(stub, "filtered", "orders", filter=pb.GroupFilter(header_equals={"type": b"order"}))
    group(stub, "filtered", "eu", filter=pb.GroupFilter(key_prefix=b"eu-"))
    publish(stub, "filtered", b"o1", key=b"eu-1", headers={"type": b"order"})
    publish(stub, "filtered", b"r1", key=b"us-1", headers={"type": b"refund"})
    publish(stub, "filtered", b"o2", key=b"us-2", headers={"type": b"order"})
    publish(stub, "filtered", b"plain")

    orders = lease(stub, "filtered", "orders", n=10)
    assert sorted(values(orders)) == [b"o1", b"o2"]
    assert ack(stub, "filtered", "orders", receipts(orders)) == [ACKED] * 2
    desc = describe(stub, "filtered", "orders")
    assert (total(desc, "filtered"), total(desc, "acked"), total(desc, "lag")) == (2, 2, 0)

    eu = lease(stub, "filtered", "eu", n=10)
    assert values(eu) == [b"o1"]
    assert total(describe(stub, "filtered", "eu"), "filtered") == 3


# -- Consume --------------------------------------------------------------------------------


def test_consume_pushes_new_messages_and_never_exceeds_max_in_flight(stub: Stub) -> None:
    work_queue(stub, "push", partitions=2)
    group(stub, "push")
    window = 3
    stream = stub.Consume(
        pb.ConsumeRequest(
            queue="push", group="g", consumer_id="pusher", max_in_flight=window, lease_ms=30_000
        ),
        timeout=30,
    )
    inbox: queue.Queue[pb.LeasedMessage | BaseException] = queue.Queue()

    def read() -> None:
        try:
            for resp in stream:
                for m in resp.messages:
                    inbox.put(m)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                inbox.put(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)  # the stream is open and idle before anything is published
        assert inbox.empty()
        sent = [b"v%02d" % i for i in range(10)]
        publish(stub, "push", *sent)
        got: list[pb.LeasedMessage] = []
        acked = 0
        checked_quiet = False
        while len(got) < len(sent):
            item = inbox.get(timeout=5)
            assert isinstance(item, pb.LeasedMessage), item
            got.append(item)
            unacked = len(got) - acked
            assert unacked <= window, f"{unacked} unacked messages with max_in_flight={window}"
            if unacked == window:
                if not checked_quiet:
                    # The window is full: nothing more comes until something is acked.
                    time.sleep(0.5)
                    assert inbox.empty()
                    in_flight = dict(describe(stub, "push").in_flight_by_consumer)
                    assert in_flight == {"pusher": window}
                    checked_quiet = True
                assert ack(stub, "push", "g", [got[acked].receipt]) == [ACKED]
                acked += 1
        assert ack(stub, "push", "g", receipts(got[acked:])) == [ACKED] * (len(got) - acked)
        assert sorted(values(got)) == sent
        assert {m.receipt.attempt for m in got} == {1}
    finally:
        stream.cancel()
        reader.join(5)
    assert total(describe(stub, "push"), "lag") == 0

    def id_free() -> bool:
        try:
            lease(stub, "push", consumer="pusher")
        except grpc.RpcError as err:
            assert rich_error(err).reason == "CONSUMER_BUSY", err
            return False
        return True

    # Cancelling the stream frees its consumer id.
    wait_for(id_free, timeout_s=3, what="the consumer id of a cancelled Consume stream freed")


# -- transactions ---------------------------------------------------------------------------


def test_transact_with_a_stale_receipt_applies_nothing(stub: Stub) -> None:
    work_queue(stub, "tx-in")
    group(stub, "tx-in")
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="tx-out")))
    publish(stub, "tx-in", b"first", b"second")
    (short,) = lease(stub, "tx-in", consumer="a", lease_ms=200)
    (good,) = lease(stub, "tx-in", consumer="a", lease_ms=30_000)
    # The short lease expires and goes to b: a's receipt for it is stale.
    (taken,) = lease_all(stub, "tx-in", consumer="b", count=1)
    assert taken.receipt.offset == short.receipt.offset and taken.receipt.attempt == 2

    req = pb.TransactRequest(
        acks=[pb.AckRequest(queue="tx-in", group="g", receipts=[good.receipt, short.receipt])],
        publishes=[pb.PublishRequest(queue="tx-out", messages=[pb.PublishMessage(value=b"r")])],
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Transact(req)
    e = rich_error(info.value)
    assert (e.code, e.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_NOT_HELD")
    assert e.metadata["field"] == "acks[0].receipts[1]"
    assert e.metadata["status"] == "RECEIPT_STATUS_STALE"
    # Nothing of the transaction happened: no publish, no ack.
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="tx-out")).messages == 0
    assert dict(describe(stub, "tx-in").in_flight_by_consumer) == {"a": 1, "b": 1}
    # The good receipt is still held and can be acked on its own.
    assert ack(stub, "tx-in", "g", [good.receipt]) == [ACKED]
    assert ack(stub, "tx-in", "g", [taken.receipt]) == [ACKED]


def test_transact_acks_and_publishes_together(stub: Stub) -> None:
    work_queue(stub, "tx2-in", partitions=2)
    group(stub, "tx2-in")
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="tx2-out")))
    publish(stub, "tx2-in", b"1", b"2", b"3")
    got = lease_all(stub, "tx2-in", count=3)
    resp = stub.Transact(
        pb.TransactRequest(
            acks=[pb.AckRequest(queue="tx2-in", group="g", receipts=receipts(got))],
            publishes=[
                pb.PublishRequest(queue="tx2-out", messages=[pb.PublishMessage(value=b"sum=6")])
            ],
        )
    )
    assert [list(a.statuses) for a in resp.acks] == [[ACKED] * 3]
    (r,) = resp.publishes[0].results
    fetched = stub.Fetch(pb.FetchRequest(queue="tx2-out", partition=r.partition, offset=r.offset))
    assert [rec.value for rec in fetched.records] == [b"sum=6"]
    assert ack(stub, "tx2-in", "g", receipts(got)) == [ALREADY_ACKED] * 3
    desc = describe(stub, "tx2-in")
    assert (total(desc, "acked"), total(desc, "lag"), total(desc, "in_flight")) == (3, 0, 0)


# -- purge, stats, delays, metrics ----------------------------------------------------------


def test_purge_ready_without_destructive_keeps_a_leased_message_ackable(stub: Stub) -> None:
    work_queue(stub, "purge-ready")
    group(stub, "purge-ready")
    publish(stub, "purge-ready", *[b"m%d" % i for i in range(5)])
    publish(stub, "purge-ready", b"delayed", delay_ms=500)
    (held,) = lease(stub, "purge-ready", lease_ms=30_000)
    resp = stub.PurgeQueue(pb.PurgeQueueRequest(name="purge-ready", scope=pb.PURGE_SCOPE_READY))
    assert resp.skipped_deliveries == 4  # m1..m4; neither the leased m0 nor the delayed one
    assert lease(stub, "purge-ready", n=10) == []
    assert dict(describe(stub, "purge-ready").in_flight_by_consumer) == {"c": 1}
    assert ack(stub, "purge-ready", "g", [held.receipt]) == [ACKED]
    # A delayed message is SCHEDULED, not READY: it is still delivered once due.
    later = lease(stub, "purge-ready", n=10, wait_ms=5_000)
    assert values(later) == [b"delayed"]
    assert ack(stub, "purge-ready", "g", receipts(later)) == [ACKED]
    desc = describe(stub, "purge-ready")
    assert (total(desc, "lag"), total(desc, "in_flight")) == (0, 0)


def test_queue_stats_show_group_lag_and_dead_letters(stub: Stub) -> None:
    work_queue(stub, "stats")
    group(stub, "stats", "busy")
    group(stub, "stats", "idle")
    publish(stub, "stats", *[b"m%d" % i for i in range(6)])
    got = by_offset(lease(stub, "stats", "busy", n=4, lease_ms=30_000))
    assert ack(stub, "stats", "busy", receipts(got[:2])) == [ACKED] * 2
    assert nack(stub, "stats", "busy", [got[2].receipt], dead=True) == [DEAD_LETTERED]
    assert nack(stub, "stats", "busy", [got[3].receipt], retry_after_ms=60_000) == [NACKED]
    assert len(lease(stub, "stats", "busy", lease_ms=30_000)) == 1
    stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="stats"))
    # busy: offsets 0-2 done (committed 3 of 6), 3 waits for its retry, 4 is leased.
    assert {g.name: (g.lag, g.in_flight, g.scheduled) for g in stats.groups} == {
        "busy": (3, 1, 1),
        "idle": (6, 0, 0),
    }
    assert stats.dead_letters == 1


def test_delayed_message_is_leasable_only_once_due(stub: Stub) -> None:
    work_queue(stub, "delayed")
    group(stub, "delayed")
    started = time.monotonic()
    publish(stub, "delayed", b"later", delay_ms=800)
    publish(stub, "delayed", b"now")
    assert values(lease(stub, "delayed", n=10)) == [b"now"]
    assert lease(stub, "delayed", n=10) == []
    assert total(describe(stub, "delayed"), "scheduled") == 1
    got = lease(stub, "delayed", n=10, wait_ms=5_000)
    elapsed = time.monotonic() - started
    assert values(got) == [b"later"] and got[0].receipt.attempt == 1
    assert 0.75 <= elapsed < 4, f"leased {elapsed:.2f}s after a publish with delay_ms=800"


def test_metrics_expose_group_lag_and_dead_letter_depth(node: Node, stub: Stub) -> None:
    work_queue(stub, "metered")
    group(stub, "metered", "mg")
    publish(stub, "metered", b"a", b"b", b"c")
    (m,) = lease(stub, "metered", "mg")
    assert nack(stub, "metered", "mg", [m.receipt], dead=True) == [DEAD_LETTERED]
    text = scrape(node)
    assert 'fluxmq_group_lag_messages{group="mg",queue="metered"} 2.0' in text
    assert 'fluxmq_group_dead_lettered_messages_total{group="mg",queue="metered"} 1.0' in text
    assert 'fluxmq_dead_letter_messages{queue="metered"} 1.0' in text
