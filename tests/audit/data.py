"""Broker data for the audit tests, made by real `fluxmq serve` processes over gRPC.

The same workload runs on a single node and on three Raft replicas: a keyed work queue with two
consumer groups (acks, dead letters, leases still out), a queue whose retention removed records
that had been dead-lettered, a stream queue with committed offsets, and two queues sharing one
DLQ, one of which purged its letters (kept in the log behind the other's). The nodes are stopped
before their directories are used, so every store is complete and at rest. Each publish is one
record batch per partition; BATCHED gets publishes of several messages, so some of its batches
hold several records.

``build_batch_store`` writes a small store straight through ``LmdbStore`` (no broker): one
stream queue whose log holds batches of known sizes, for tests of the batch layout itself.
"""

from __future__ import annotations

import time
from pathlib import Path

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core import keys
from storage import LmdbStore
from storage.api import NewRecord
from tests.audit import spec_codec
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.delivery_helpers import (
    ack,
    group,
    lease_all,
    nack,
    publish,
    receipts,
    work_queue,
)

Stub = queue_pb2_grpc.QueueServiceStub
ORDERS = "orders"  # work queue, 3 partitions, keyed, idempotency keys, groups billing + late
SHORT = "short"  # work queue whose retention removed dead-lettered records
EVENTS = "events"  # stream queue with a group that committed offsets
LEFT, RIGHT = "left", "right"  # work queues sharing the DLQ SHARED_DLQ
SHARED_DLQ = "common-dlq"  # offsets: 0 right-0, 1 left-0 (purged), 2 left-1 (purged), 3 right-1
ORDERS_PARTITIONS = 3
BATCHED = "batched"  # stream queue, 1 partition: publishes of BATCHED_SIZES messages
BATCHED_SIZES = (3, 5, 4, 1, 6)  # one batch each: [0, 2], [3, 7], [8, 11], [12], [13, 18]
# Stream queue, 2 partitions, no keys, published through producer sessions (SESSION_LAYOUT).
SESSIONS = "sessions"
# partition -> the batches stored, in offset order: (producer, epoch, first sequence, count);
# producer "alpha" is named (epochs 0 and 1), "anon" is not, None is a publish without a session.
# Partition 1's first batch came as encoded records (tests/audit/spec_codec.py wrote them).
SESSION_LAYOUT = {
    0: [("alpha", 0, 0, 3), (None, 0, 0, 1), ("alpha", 0, 3, 2), ("anon", 0, 0, 2),
        ("alpha", 1, 0, 2), ("alpha", 1, 2, 1)],
    1: [("alpha", 0, 0, 4), ("alpha", 1, 0, 2)],
}  # fmt: skip


def workload(stub: Stub) -> None:
    work_queue(stub, ORDERS, partitions=ORDERS_PARTITIONS)
    group(stub, ORDERS, "billing")
    for i in range(60):
        publish(stub, ORDERS, b"order-%03d" % i, key=b"k%d" % (i % 6), idempotency_key=f"o-{i}")
    dup = publish(stub, ORDERS, b"order-007", key=b"k1", idempotency_key="o-7")
    assert dup[0].duplicate  # the broker's dedup: nothing stored
    got = lease_all(stub, ORDERS, "billing", count=30)
    ack(stub, ORDERS, "billing", receipts(got[:20]))
    nack(stub, ORDERS, "billing", receipts(got[20:25]), dead=True, reason="audit test")
    # got[25:] stays leased.
    group(stub, ORDERS, "late", start=pb.StartPosition(latest=True))
    for i in range(60, 80):
        publish(stub, ORDERS, b"order-%03d" % i, key=b"k%d" % (i % 6), idempotency_key=f"o-{i}")
    late = lease_all(stub, ORDERS, "late", count=10)
    ack(stub, ORDERS, "late", receipts(late))

    work_queue(stub, SHORT, retention=pb.Retention(max_messages=5))
    group(stub, SHORT, "g")
    for i in range(3):
        publish(stub, SHORT, b"short-%d" % i)
    doomed = lease_all(stub, SHORT, "g", count=3)
    nack(stub, SHORT, "g", receipts(doomed), dead=True, reason="to be removed by retention")
    for i in range(3, 20):
        publish(stub, SHORT, b"short-%d" % i)
    _wait_low(stub, SHORT, 15)

    stub.CreateQueue(
        pb.CreateQueueRequest(
            config=pb.QueueConfig(name=EVENTS, partitions=2, type=pb.QUEUE_TYPE_STREAM)
        )
    )
    group(stub, EVENTS, "reader")
    for i in range(40):
        publish(stub, EVENTS, b"event-%d" % i, key=b"e%d" % (i % 4))
    stub.CommitOffsets(pb.CommitOffsetsRequest(queue=EVENTS, group="reader", offsets={0: 5, 1: 7}))

    for name in (LEFT, RIGHT):
        work_queue(stub, name, dead_letter_queue=SHARED_DLQ)
        group(stub, name, "g")
        publish(stub, name, b"%s-0" % name.encode(), b"%s-1" % name.encode())
    for name, first, count in ((RIGHT, 0, 1), (LEFT, 0, 2), (RIGHT, 1, 1)):
        got = lease_all(stub, name, "g", count=count)
        assert [m.record.offset for m in got] == list(range(first, first + count))
        nack(stub, name, "g", receipts(got), dead=True, reason="shared")
    purged = stub.PurgeDeadLetters(pb.PurgeDeadLettersRequest(queue=LEFT, all=True))
    assert purged.purged == 2

    stub.CreateQueue(
        pb.CreateQueueRequest(
            config=pb.QueueConfig(name=BATCHED, partitions=1, type=pb.QUEUE_TYPE_STREAM)
        )
    )
    sent = 0
    for size in BATCHED_SIZES:
        values = [b"batched-%d" % i for i in range(sent, sent + size)]
        results = publish(stub, BATCHED, *values, key=b"b")
        assert [r.offset for r in results] == list(range(sent, sent + size))
        sent += size
    sessions(stub)


def sessions(stub: Stub) -> None:
    """SESSION_LAYOUT, with a retried request (answered as a duplicate, stored once)."""
    stub.CreateQueue(
        pb.CreateQueueRequest(
            config=pb.QueueConfig(name=SESSIONS, partitions=2, type=pb.QUEUE_TYPE_STREAM)
        )
    )
    alpha = stub.InitProducer(pb.InitProducerRequest(queue=SESSIONS, producer_name="alpha"))
    anon = stub.InitProducer(pb.InitProducerRequest(queue=SESSIONS))
    producers = {"alpha": [alpha], "anon": [anon]}
    stored: dict[int, int] = {0: 0, 1: 0}
    for partition, producer, epoch, first_seq, count in _session_requests():
        if producer == "alpha" and epoch == 1 and len(producers["alpha"]) == 1:
            again = stub.InitProducer(pb.InitProducerRequest(queue=SESSIONS, producer_name="alpha"))
            assert again.producer_id == alpha.producer_id and again.producer_epoch == 1
            producers["alpha"].append(again)
        request = pb.PublishRequest(queue=SESSIONS)
        if producer is not None:
            grant = producers[producer][epoch]
            request.producer.producer_id = grant.producer_id
            request.producer.producer_epoch = grant.producer_epoch
            request.producer.first_sequence = first_seq
        values = [
            b"%s-%d-%d" % (str(producer).encode(), epoch, first_seq + i) for i in range(count)
        ]
        if partition == 1 and epoch == 0:
            section = spec_codec.encode_records([spec_codec.SpecRecord(0, v) for v in values], 0)
            request.encoded.partition, request.encoded.count = partition, count
            request.encoded.records = section
            answer = stub.Publish(request).batch
            assert (answer.base_offset, answer.count) == (stored[partition], count)
        else:
            request.messages.extend(pb.PublishMessage(value=v, partition=partition) for v in values)
            results = stub.Publish(request).results
            assert [r.offset for r in results] == list(
                range(stored[partition], stored[partition] + count)
            )
        if (producer, epoch, first_seq) == ("alpha", 0, 3):  # its answer "lost": sent again
            retried = stub.Publish(request).results
            assert all(r.duplicate for r in retried)
        stored[partition] += count


def _session_requests() -> list[tuple[int, str | None, int, int, int]]:
    """SESSION_LAYOUT as requests in the order they are sent: alpha's epoch 1 after all of
    epoch 0 (the new epoch fences the old one), each partition's batches in their order."""
    requests = [(p, *batch) for p in sorted(SESSION_LAYOUT) for batch in SESSION_LAYOUT[p]]
    return sorted(requests, key=lambda r: r[1] == "alpha" and r[2] == 1)


def _wait_low(stub: Stub, queue: str, low: int, timeout_s: float = 20.0) -> None:
    """Retention runs on the leader's timer: wait until it removed up to ``low``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Fetch at the target: an offset below the low watermark would be refused.
        r = stub.Fetch(pb.FetchRequest(queue=queue, partition=0, offset=low, max_messages=1))
        if r.low_watermark >= low:
            return
        time.sleep(0.1)
    raise AssertionError(f"retention did not cut {queue} to {low}")


def build_single(root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    node = Node(root / "solo", "--retention-interval-ms", "100")
    node.start()
    try:
        with node.channel() as ch:
            workload(queue_pb2_grpc.QueueServiceStub(ch))
    finally:
        assert node.stop() == 0
    return [node.data_dir]


def build_cluster(root: Path) -> list[Path]:
    cluster = Cluster(root, 3, "--retention-interval-ms", "100")
    cluster.start()
    try:
        leader = cluster.wait_leader()
        with leader.channel() as ch:
            workload(queue_pb2_grpc.QueueServiceStub(ch))
        cluster.wait_converged()
    finally:
        cluster.stop()
    return [n.data_dir for n in cluster.nodes]


STORE_QUEUE = "stored"  # the queue of build_batch_store
STORE_QUEUE_ID = 7
STORE_BATCHES = (
    3,
    5,
    4,
    1,
    6,
)  # records per append: batches [0, 2], [3, 7], [8, 11], [12], [13, 18]
STORE_T0_MS = 1_700_000_000_000


def build_batch_store(data_dir: Path, truncate_before: int = 0) -> int:
    """A store with one stream queue (STORE_QUEUE, one partition) holding STORE_BATCHES, one
    append each, timestamps rising by 1 ms per record, truncated below ``truncate_before``.
    -> the log's id."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config = pb.QueueConfig(name=STORE_QUEUE, partitions=1, type=pb.QUEUE_TYPE_STREAM)
    queue = pb.Queue(queue_id=STORE_QUEUE_ID, config=config)
    log_id = keys.log_id(STORE_QUEUE_ID, 0)
    store = LmdbStore(str(data_dir))
    try:
        with store.write() as txn:
            txn.put(keys.queue_key(STORE_QUEUE), queue.SerializeToString())
            log = txn.log(log_id)
            offset = 0
            for size in STORE_BATCHES:
                records = [
                    NewRecord(
                        STORE_T0_MS + i,
                        b"value-%d" % i,
                        key=b"k%d" % (i % 2),
                        headers=(("h", b"%d" % i),),
                        idempotency_key=f"id-{i}",
                    )
                    for i in range(offset, offset + size)
                ]
                assert log.append(records) == offset
                offset += size
            if truncate_before:
                log.truncate_before(truncate_before)
    finally:
        store.close()
    return log_id
