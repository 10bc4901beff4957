"""Delivery state across kill -9: leases, scheduled retries, offsets and dead letters are as
durable as the messages, and a consumer that keeps going through a crash loses nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .delivery_helpers import (
    ACKED,
    ALREADY_ACKED,
    DEAD_LETTERED,
    NACKED,
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
    total,
    values,
    work_queue,
)

T = TypeVar("T")

# Long enough that the node is back (about a second) before the retry is due; the test checks.
RETRY_MS = 3_000
HELD_LEASE_MS = 12_000


def restart(node: Node) -> float:
    """kill -9 and start again; -> seconds until the node served again."""
    started = time.monotonic()
    node.kill9()
    node.start()
    return time.monotonic() - started


def offsets(stub: Stub, queue: str, grp: str) -> list[tuple[int, int, int]]:
    resp = stub.GetOffsets(pb.GetOffsetsRequest(queue=queue, group=grp))
    return [(p.partition, p.committed, p.latest) for p in resp.partitions]


def test_leases_and_scheduled_retries_survive_kill_9(tmp_path: Path) -> None:
    node = Node(tmp_path / "n")
    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            work_queue(stub, "dur")
            group(stub, "dur")
            publish(stub, "dur", b"held", b"retry")
            (held,) = lease(stub, "dur", consumer="a", lease_ms=HELD_LEASE_MS)
            (retry,) = lease(stub, "dur", consumer="a", lease_ms=HELD_LEASE_MS)
            assert (held.record.value, retry.record.value) == (b"held", b"retry")
            assert nack(stub, "dur", "g", [retry.receipt], retry_after_ms=RETRY_MS) == [NACKED]
            nacked_at = time.monotonic()
            before = describe(stub, "dur")
        took = restart(node)
        since_nack = time.monotonic() - nacked_at
        assert since_nack < RETRY_MS / 1000 - 0.5, f"restart took {took:.1f}s: timing too tight"
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            assert describe(stub, "dur") == before
            # Right after the restart nothing is leasable: one message is leased, one not due.
            assert lease(stub, "dur", consumer="b", n=10) == []
            # The retry comes back when due (attempt 2); the held lease is never handed out.
            (again,) = lease_all(stub, "dur", consumer="b", count=1, timeout_s=RETRY_MS / 1000 + 3)
            waited = time.monotonic() - nacked_at
            assert (again.record.value, again.receipt.attempt) == (b"retry", 2)
            assert waited >= RETRY_MS / 1000 - 0.2, f"retry delivered after {waited:.2f}s"
            assert lease(stub, "dur", consumer="b", n=10, wait_ms=300) == []
            assert time.monotonic() - nacked_at < HELD_LEASE_MS / 1000 - 1, "timing too tight"
            # The lease taken before the crash still holds: its receipt acks.
            assert ack(stub, "dur", "g", [held.receipt]) == [ACKED]
            assert ack(stub, "dur", "g", [again.receipt]) == [ACKED]
            desc = describe(stub, "dur")
            assert (total(desc, "lag"), total(desc, "acked"), total(desc, "in_flight")) == (0, 2, 0)
    finally:
        node.stop()


def test_offsets_and_dead_letters_survive_kill_9(tmp_path: Path) -> None:
    node = Node(tmp_path / "n")
    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            # A stream queue read with Fetch, checkpointed with CommitOffsets.
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="s", partitions=2)))
            group(stub, "s", "reader")
            for p in (0, 1):
                publish(stub, "s", *[b"s%d" % i for i in range(6)], partition=p)
            stub.CommitOffsets(
                pb.CommitOffsetsRequest(queue="s", group="reader", offsets={0: 3, 1: 5})
            )
            # A work queue, consumed, then rewound with ResetOffsets.
            work_queue(stub, "w")
            group(stub, "w")
            publish(stub, "w", *[b"w%d" % i for i in range(6)])
            done = lease_all(stub, "w", count=6)
            assert ack(stub, "w", "g", receipts(done)) == [ACKED] * 6
            stub.ResetOffsets(
                pb.ResetOffsetsRequest(queue="w", group="g", to=pb.StartPosition(offset=2))
            )
            # A dead letter.
            work_queue(stub, "d")
            group(stub, "d")
            publish(stub, "d", b"poison", key=b"k", headers={"h": b"v"})
            (m,) = lease(stub, "d")
            assert nack(stub, "d", "g", [m.receipt], dead=True, reason="boom") == [DEAD_LETTERED]
            before = (
                offsets(stub, "s", "reader"),
                offsets(stub, "w", "g"),
                dead_letters(stub, "d"),
                stub.GetQueueStats(pb.GetQueueStatsRequest(name="d")),
                [describe(stub, q, g) for q, g in (("s", "reader"), ("w", "g"), ("d", "g"))],
            )
            assert before[0] == [(0, 3, 6), (1, 5, 6)] and before[1] == [(0, 2, 6)]
            assert len(before[2]) == 1 and before[3].dead_letters == 1
        restart(node)
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            after = (
                offsets(stub, "s", "reader"),
                offsets(stub, "w", "g"),
                dead_letters(stub, "d"),
                stub.GetQueueStats(pb.GetQueueStatsRequest(name="d")),
                [describe(stub, q, g) for q, g in (("s", "reader"), ("w", "g"), ("d", "g"))],
            )
            assert after == before
            # The rewound work queue delivers from offset 2 again, first attempts.
            again = sorted(lease_all(stub, "w", count=4), key=lambda m: m.receipt.offset)
            assert [(m.receipt.offset, m.receipt.attempt) for m in again] == [
                (2, 1), (3, 1), (4, 1), (5, 1)
            ]  # fmt: skip
            assert lease(stub, "w", n=10) == []
            # The dead letter can still be replayed.
            (dl,) = after[2]
            assert (dl.reason, dl.group, dl.record.value) == ("boom", "g", b"poison")
            req = pb.ReplayDeadLettersRequest(queue="d", ids=[dl.id])
            assert stub.ReplayDeadLetters(req).replayed == 1
            (back,) = lease_all(stub, "d", count=1)
            assert (back.record.value, back.receipt.attempt) == (b"poison", 1)
            assert dead_letters(stub, "d") == []
    finally:
        node.stop()


# -- at least once ------------------------------------------------------------------------

N = 2000
BATCH = 20
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


class Conn:
    """The current channel to a node that is killed and restarted under running threads."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._channel = node.channel()
        self.restarted = threading.Event()

    def stub(self) -> Stub:
        with self._lock:
            return queue_pb2_grpc.QueueServiceStub(self._channel)

    def reconnect(self) -> None:
        # A new channel: the old one may sit in reconnect backoff for seconds.
        with self._lock:
            old, self._channel = self._channel, self._node.channel()
        old.close()
        self.restarted.set()

    def close(self) -> None:
        with self._lock:
            self._channel.close()

    def call(self, fn: Callable[[Stub], T], stop: threading.Event) -> T:
        """``fn`` on the current channel; across the crash, retried once the node is back."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return fn(self.stub())
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE or time.monotonic() > deadline or stop.is_set():
                    raise
                self.restarted.wait(30)
                time.sleep(0.05)


def test_consumer_through_kill_9_acks_every_published_message_at_least_once(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "n")
    node.start()
    conn = Conn(node)
    published: set[bytes] = set()  # acknowledged by Publish
    acked: set[bytes] = set()  # an Ack of ours applied (ACKED, or ALREADY_ACKED on a retry)
    deliveries: Counter[bytes] = Counter()
    stale = 0
    failures: list[BaseException] = []
    publishing_done = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    try:
        stub = conn.stub()
        work_queue(stub, "alo", partitions=4)
        group(stub, "alo")

        def publisher() -> None:
            try:
                for b in range(N // BATCH):
                    batch = [b"m%05d" % (b * BATCH + i) for i in range(BATCH)]
                    # Idempotency keys make the retry of a batch whose answer was lost safe.
                    msgs = [pb.PublishMessage(value=v, idempotency_key=v.decode()) for v in batch]
                    req = pb.PublishRequest(queue="alo", messages=msgs)
                    res = conn.call(lambda s, req=req: s.Publish(req, timeout=10), stop)
                    assert len(res.results) == BATCH
                    with lock:
                        published.update(batch)
                    time.sleep(0.005)
            except BaseException as exc:
                failures.append(exc)
            finally:
                publishing_done.set()

        def consumer() -> None:
            nonlocal stale
            try:
                while not stop.is_set():
                    req = pb.LeaseRequest(
                        queue="alo", group="g", consumer_id="worker", max_messages=100,
                        lease_ms=1_000, wait_ms=200,
                    )  # fmt: skip
                    got = conn.call(lambda s, req=req: s.Lease(req, timeout=10).messages, stop)
                    if not got:
                        with lock:
                            if publishing_done.is_set() and published <= acked:
                                return
                        continue
                    deliveries.update(values(got))
                    areq = pb.AckRequest(queue="alo", group="g", receipts=receipts(got))
                    # Retried across the crash: ALREADY_ACKED then means our first try applied
                    # (one consumer; the end state shows nothing was dead-lettered or skipped).
                    statuses = conn.call(lambda s, r=areq: s.Ack(r, timeout=10).statuses, stop)
                    with lock:
                        for m, st in zip(got, statuses, strict=True):
                            if st in (ACKED, ALREADY_ACKED):
                                acked.add(m.record.value)
                            else:
                                stale += 1  # expired meanwhile: it comes again
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=publisher), threading.Thread(target=consumer)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not failures:
            with lock:
                # Mid-way for both: half published, and the consumer busy (unless it lags).
                if len(published) >= N // 2 and (
                    len(acked) >= N // 4 or len(published) >= 3 * N // 4
                ):
                    break
            time.sleep(0.01)
        with lock:
            at_kill = (len(published), len(acked))
        assert at_kill[0] < N, f"publishing finished before the kill: {at_kill}"
        restart(node)
        conn.reconnect()
        for t in threads:
            t.join(45)
        stop.set()
        alive = [t for t in threads if t.is_alive()]

        dups = sum(deliveries.values()) - len(deliveries)
        lost = published - acked
        summary = (
            f"killed at {at_kill[0]} published / {at_kill[1]} acked; published {len(published)}, "
            f"acked {len(acked)}, lost {len(lost)} (e.g. {sorted(lost)[:5]}), "
            f"duplicate deliveries {dups}, stale acks {stale}, failures {failures!r}"
        )
        assert not failures and not alive, summary
        assert len(published) == N, summary
        assert not lost, summary
        assert set(deliveries) == published, summary
        desc = describe(conn.stub(), "alo")
        ends = {
            k: total(desc, k)
            for k in ("lag", "in_flight", "scheduled", "dead", "skipped_by_retention")
        }
        assert ends == dict.fromkeys(ends, 0), f"{ends}; {summary}"
        assert lease(conn.stub(), "alo", n=100) == [], summary
    finally:
        stop.set()
        conn.close()
        node.stop()
