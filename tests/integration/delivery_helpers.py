"""Small helpers for the consumer-group tests: queues, groups, leases and bounded waits."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node

Stub = queue_pb2_grpc.QueueServiceStub

ACKED = pb.RECEIPT_STATUS_ACKED
ALREADY_ACKED = pb.RECEIPT_STATUS_ALREADY_ACKED
UNKNOWN = pb.RECEIPT_STATUS_UNKNOWN
STALE = pb.RECEIPT_STATUS_STALE
NACKED = pb.RECEIPT_STATUS_NACKED
DEAD_LETTERED = pb.RECEIPT_STATUS_DEAD_LETTERED
EXTENDED = pb.RECEIPT_STATUS_EXTENDED


def work_queue(stub: Stub, name: str, **config: Any) -> pb.Queue:
    cfg = pb.QueueConfig(name=name, type=pb.QUEUE_TYPE_WORK, **config)
    return stub.CreateQueue(pb.CreateQueueRequest(config=cfg))


def group(stub: Stub, queue: str, name: str = "g", **kw: Any) -> pb.Group:
    return stub.CreateGroup(pb.CreateGroupRequest(queue=queue, group=name, **kw))


def publish(stub: Stub, queue: str, *values: bytes, **msg: Any) -> list[pb.PublishResult]:
    messages = [pb.PublishMessage(value=v, **msg) for v in values]
    return list(stub.Publish(pb.PublishRequest(queue=queue, messages=messages)).results)


def lease(
    stub: Stub,
    queue: str,
    grp: str = "g",
    consumer: str = "c",
    n: int = 1,
    lease_ms: int = 0,
    wait_ms: int = 0,
) -> list[pb.LeasedMessage]:
    req = pb.LeaseRequest(
        queue=queue,
        group=grp,
        consumer_id=consumer,
        max_messages=n,
        lease_ms=lease_ms,
        wait_ms=wait_ms,
    )
    return list(stub.Lease(req, timeout=wait_ms / 1000 + 10).messages)


def lease_all(
    stub: Stub,
    queue: str,
    grp: str = "g",
    consumer: str = "c",
    count: int = 1,
    lease_ms: int = 30_000,
    timeout_s: float = 5.0,
) -> list[pb.LeasedMessage]:
    """Lease until ``count`` messages came (or ``timeout_s`` passed): what came, in order."""
    out: list[pb.LeasedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        out += lease(stub, queue, grp, consumer, count - len(out), lease_ms, min(left_ms, 1000))
    return out


def ack(stub: Stub, queue: str, grp: str, receipts: Sequence[pb.Receipt]) -> list[int]:
    return list(stub.Ack(pb.AckRequest(queue=queue, group=grp, receipts=receipts)).statuses)


def nack(stub: Stub, queue: str, grp: str, receipts: Sequence[pb.Receipt], **kw: Any) -> list[int]:
    req = pb.NackRequest(queue=queue, group=grp, receipts=receipts, **kw)
    return list(stub.Nack(req).statuses)


def receipts(messages: Sequence[pb.LeasedMessage]) -> list[pb.Receipt]:
    return [m.receipt for m in messages]


def values(messages: Sequence[pb.LeasedMessage]) -> list[bytes]:
    return [m.record.value for m in messages]


def describe(stub: Stub, queue: str, grp: str = "g") -> pb.GroupDescription:
    return stub.DescribeGroup(pb.DescribeGroupRequest(queue=queue, group=grp))


def total(desc: pb.GroupDescription, name: str) -> int:
    """A GroupPartition counter summed over the partitions."""
    return sum(getattr(p, name) for p in desc.partitions)


def dead_letters(stub: Stub, queue: str, grp: str = "") -> list[pb.DeadLetter]:
    req = pb.ListDeadLettersRequest(queue=queue, group=grp)
    return list(stub.ListDeadLetters(req).dead_letters)


def wait_for(predicate: Callable[[], Any], timeout_s: float = 5.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy (which is returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {timeout_s}s: {what or predicate}")
        time.sleep(0.05)


def scrape(node: Node) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())
