"""Every bad input gets the documented code, reason and field, and the broker keeps serving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .rpc_helpers import rich_error

Stub = queue_pb2_grpc.QueueServiceStub
MiB = 1024 * 1024


def msgs(n: int, size: int = 8) -> list[pb.PublishMessage]:
    return [pb.PublishMessage(value=b"x" * size) for _ in range(n)]


CASES: list[tuple[str, Callable[[Stub], Any], grpc.StatusCode, str, str | None]] = [
    ("empty batch", lambda s: s.Publish(pb.PublishRequest(queue="t")),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "messages"),
    ("1001 messages", lambda s: s.Publish(pb.PublishRequest(queue="t", messages=msgs(1001))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "messages"),
    ("oversize message",
     lambda s: s.Publish(pb.PublishRequest(queue="t", messages=[*msgs(2), *msgs(1, MiB + 1)])),
     grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE", "messages[2].value"),
    ("bad queue name", lambda s: s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="no spaces"))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "config.name"),
    ("bad queue name on publish", lambda s: s.Publish(pb.PublishRequest(queue="a/b", messages=msgs(1))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "queue"),
    ("unknown queue", lambda s: s.Publish(pb.PublishRequest(queue="nope", messages=msgs(1))),
     grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", None),
    ("existing queue", lambda s: s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="t"))),
     grpc.StatusCode.ALREADY_EXISTS, "QUEUE_EXISTS", None),
    ("partition out of range on publish",
     lambda s: s.Publish(pb.PublishRequest(queue="t", messages=[pb.PublishMessage(value=b"v", partition=2)])),
     grpc.StatusCode.INVALID_ARGUMENT, "PARTITION_OUT_OF_RANGE", "messages[0].partition"),
    ("partition out of range on fetch", lambda s: s.Fetch(pb.FetchRequest(queue="t", partition=9)),
     grpc.StatusCode.INVALID_ARGUMENT, "PARTITION_OUT_OF_RANGE", "partition"),
    ("negative offset", lambda s: s.Fetch(pb.FetchRequest(queue="t", offset=-1)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "offset"),
    ("offset above high watermark", lambda s: s.Fetch(pb.FetchRequest(queue="t", offset=10**6)),
     grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE", None),
    ("bad retention string",
     lambda s: s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(
         name="r", retention=pb.Retention(max_age="a week")))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "config.retention.max_age"),
    ("bad retention size",
     lambda s: s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(
         name="r", retention=pb.Retention(max_bytes="10 gigs")))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "config.retention.max_bytes"),
    ("too many partitions", lambda s: s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="p", partitions=1025))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "config.partitions"),
    ("too-short request timeout",
     lambda s: s.Publish(pb.PublishRequest(queue="t", messages=msgs(1), request_timeout_ms=5)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "request_timeout_ms"),
    ("shrinking partitions",
     lambda s: s.UpdateQueue(pb.UpdateQueueRequest(config=pb.QueueConfig(name="t", partitions=1))),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "config.partitions"),
    ("immutable field in mask",
     lambda s: s.UpdateQueue(pb.UpdateQueueRequest(config=pb.QueueConfig(name="t"), update_mask={"paths": ["type"]})),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "update_mask.paths[type]"),
    ("list limit too large", lambda s: s.ListQueues(pb.ListQueuesRequest(limit=1001)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "limit"),
    ("bad page token", lambda s: s.ListQueues(pb.ListQueuesRequest(page_token="%%%")),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "page_token"),
    ("bad label selector", lambda s: s.ListQueues(pb.ListQueuesRequest(label_selector="team")),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "label_selector"),
    ("fetch wait too long", lambda s: s.Fetch(pb.FetchRequest(queue="t", wait_ms=600_000)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "wait_ms"),
    ("oversized request", lambda s: s.Publish(pb.PublishRequest(queue="t", messages=msgs(100, MiB))),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "", None),
]  # fmt: skip


def test_bad_inputs_get_documented_errors_and_change_nothing(stub: Stub) -> None:
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="t", partitions=2)))
    stub.Publish(pb.PublishRequest(queue="t", messages=msgs(3)))
    failures = []
    for name, call, code, reason, field in CASES:
        try:
            call(stub)
        except grpc.RpcError as err:
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not reason:
                # Refused by gRPC's own size limit before it reaches us: no rich status.
                if err.code() != code:
                    failures.append(f"{name}: {err.code()} != {code}")
                continue
            e = rich_error(err)
            got = (e.code, e.reason, field in e.fields if field else True)
            if got != (code, reason, True):
                failures.append(f"{name}: got {e.code} {e.reason} {e.fields} ({e.message})")
            if not e.request_id:
                failures.append(f"{name}: no x-request-id in trailers")
        else:
            failures.append(f"{name}: succeeded")
    assert not failures, "\n".join(failures)
    # Nothing was written by any refused request, and the broker still serves.
    stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="t"))
    assert stats.messages == 3
    names = [q.config.name for q in stub.ListQueues(pb.ListQueuesRequest()).queues]
    assert names == ["t"]
    assert stub.Publish(pb.PublishRequest(queue="t", messages=msgs(1))).results[0].offset >= 0


def test_client_request_id_is_echoed_on_success_and_error(stub: Stub) -> None:
    _, call = stub.ListQueues.with_call(
        pb.ListQueuesRequest(), metadata=(("x-request-id", "req-123"),)
    )
    assert dict(call.trailing_metadata())["x-request-id"] == "req-123"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetQueue(pb.GetQueueRequest(name="missing"), metadata=(("x-request-id", "req-456"),))
    e = rich_error(info.value)
    assert (e.code, e.reason, e.request_id) == (
        grpc.StatusCode.NOT_FOUND,
        "QUEUE_NOT_FOUND",
        "req-456",
    )
    assert e.metadata["retriable"] == "false"
