"""Durability across kill -9: acknowledged means on disk; a batch is all or nothing."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node

BATCHES = 100
BATCH = 100  # 10,000 messages
PARTITIONS = 4


def batch_values(b: int, rng: random.Random) -> list[bytes]:
    return [b"b%03d-m%03d-" % (b, i) + rng.randbytes(rng.randrange(0, 200)) for i in range(BATCH)]


def read_all(stub: queue_pb2_grpc.QueueServiceStub) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for p in range(PARTITIONS):
        offset = 0
        while True:
            resp = stub.Fetch(
                pb.FetchRequest(queue="crash", partition=p, offset=offset, max_messages=5000)
            )
            for rec in resp.records:
                assert rec.offset == offset, "offsets between watermarks are contiguous"
                out[(p, rec.offset)] = rec.value
                offset += 1
            if offset >= resp.high_watermark:
                break
    return out


def test_acknowledged_messages_survive_kill_9_and_batches_are_atomic(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    values = [batch_values(b, rng) for b in range(BATCHES)]
    node = Node(tmp_path / "n")
    node.start()
    acked: dict[int, list[tuple[int, int]]] = {}
    lock = threading.Lock()
    killed = threading.Event()
    next_batch = iter(range(BATCHES))

    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="crash", partitions=PARTITIONS))
        )

        def publisher() -> None:
            while not killed.is_set():
                with lock:
                    b = next(next_batch, None)
                if b is None:
                    return
                req = pb.PublishRequest(
                    queue="crash", messages=[pb.PublishMessage(value=v) for v in values[b]]
                )
                try:
                    res = stub.Publish(req, timeout=20)
                except grpc.RpcError:
                    return  # the node died under us: this batch is unacknowledged
                with lock:
                    acked[b] = [(r.partition, r.offset) for r in res.results]
                    if len(acked) >= 60 and not killed.is_set():
                        killed.set()
                        node.kill9()

        threads = [threading.Thread(target=publisher) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert killed.is_set(), f"seed {seed}: the node was never killed"

    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            stored = read_all(stub)
            for b, positions in acked.items():
                for i, pos in enumerate(positions):
                    assert stored.get(pos) == values[b][i], (
                        f"seed {seed}: acked batch {b} msg {i} lost or changed"
                    )
            present = {v[:10] for v in stored.values()}
            for b in set(range(BATCHES)) - set(acked):
                n = sum(1 for i in range(BATCH) if b"b%03d-m%03d-" % (b, i) in present)
                assert n in (0, BATCH), (
                    f"seed {seed}: unacknowledged batch {b} half-written ({n}/{BATCH})"
                )
            # The restarted node keeps serving: publish what was not acknowledged.
            for b in sorted(set(range(BATCHES)) - set(acked)):
                stub.Publish(
                    pb.PublishRequest(
                        queue="crash", messages=[pb.PublishMessage(value=v) for v in values[b]]
                    )
                )
            everything = read_all(stub)
            assert {v for v in everything.values()} >= {v for vs in values for v in vs}
    finally:
        node.stop()
