"""Consumer-group bad inputs: the documented code, reason and field, and nothing changes.

A table like test_bad_input.py's; the cases take the receipts leased during setup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb

from .delivery_helpers import (
    ACKED,
    STALE,
    Stub,
    ack,
    group,
    lease,
    lease_all,
    publish,
    work_queue,
)
from .rpc_helpers import rich_error

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class Held:
    """Receipts leased during setup (each still held when the table runs)."""

    w: pb.Receipt  # queue "w", group "g"
    w2: pb.Receipt  # queue "w", group "g2"
    nodlq: pb.Receipt  # queue "nodlq" (dead_letter_disabled), group "g"


def lease_req(**kw: Any) -> pb.LeaseRequest:
    return pb.LeaseRequest(**{"queue": "w", "group": "g", "consumer_id": "x", **kw})


def ack_req(*rs: pb.Receipt, group: str = "g") -> pb.AckRequest:
    return pb.AckRequest(queue="w", group=group, receipts=list(rs))


def nack_req(*rs: pb.Receipt, queue: str = "w", **kw: Any) -> pb.NackRequest:
    return pb.NackRequest(queue=queue, group="g", receipts=list(rs), **kw)


def first(stream: Any) -> Any:
    return next(iter(stream))


Case = tuple[str, Callable[[Stub, Held], Any], grpc.StatusCode, str, str | None]

CASES: list[Case] = [
    ("unknown group on Lease", lambda s, h: s.Lease(lease_req(group="nope")),
     grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", None),
    ("unknown group on Ack", lambda s, h: s.Ack(ack_req(h.w, group="nope")),
     grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", None),
    ("unknown group on DescribeGroup",
     lambda s, h: s.DescribeGroup(pb.DescribeGroupRequest(queue="w", group="nope")),
     grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", None),
    ("unknown group on DeleteGroup",
     lambda s, h: s.DeleteGroup(pb.DeleteGroupRequest(queue="w", group="nope")),
     grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", None),
    ("unknown queue on CreateGroup",
     lambda s, h: s.CreateGroup(pb.CreateGroupRequest(queue="nope", group="g")),
     grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", None),
    ("CreateGroup twice", lambda s, h: s.CreateGroup(pb.CreateGroupRequest(queue="w", group="g")),
     grpc.StatusCode.ALREADY_EXISTS, "GROUP_EXISTS", None),
    ("bad group name",
     lambda s, h: s.CreateGroup(pb.CreateGroupRequest(queue="w", group="no spaces")),
     INVALID, "INVALID_ARGUMENT", "group"),
    # A receipt of group g2 given to group g; the good receipt before it is not acked either.
    ("foreign receipt on Ack", lambda s, h: s.Ack(ack_req(h.w, h.w2)),
     INVALID, "RECEIPT_MISMATCH", "receipts[1]"),
    ("foreign receipt on Nack", lambda s, h: s.Nack(nack_req(h.w2)),
     INVALID, "RECEIPT_MISMATCH", "receipts[0]"),
    ("foreign receipt on ExtendLease",
     lambda s, h: s.ExtendLease(pb.ExtendLeaseRequest(queue="w", group="g", receipts=[h.w2])),
     INVALID, "RECEIPT_MISMATCH", "receipts[0]"),
    ("foreign receipt in Transact",
     lambda s, h: s.Transact(pb.TransactRequest(acks=[ack_req(h.w2)])),
     INVALID, "RECEIPT_MISMATCH", "acks[0].receipts[0]"),
    ("lease_ms below 100", lambda s, h: s.Lease(lease_req(lease_ms=99)),
     INVALID, "INVALID_ARGUMENT", "lease_ms"),
    ("lease_ms above 12h", lambda s, h: s.Lease(lease_req(lease_ms=43_200_001)),
     INVALID, "INVALID_ARGUMENT", "lease_ms"),
    ("ExtendLease lease_ms below 100",
     lambda s, h: s.ExtendLease(
         pb.ExtendLeaseRequest(queue="w", group="g", receipts=[h.w], lease_ms=50)),
     INVALID, "INVALID_ARGUMENT", "lease_ms"),
    ("max_messages 1001", lambda s, h: s.Lease(lease_req(max_messages=1001)),
     INVALID, "INVALID_ARGUMENT", "max_messages"),
    ("lease wait_ms too long", lambda s, h: s.Lease(lease_req(wait_ms=60_001)),
     INVALID, "INVALID_ARGUMENT", "wait_ms"),
    ("empty consumer_id", lambda s, h: s.Lease(lease_req(consumer_id="")),
     INVALID, "INVALID_ARGUMENT", "consumer_id"),
    ("Consume max_in_flight 10001",
     lambda s, h: first(s.Consume(pb.ConsumeRequest(
         queue="w", group="g", consumer_id="x", max_in_flight=10_001), timeout=10)),
     INVALID, "INVALID_ARGUMENT", "max_in_flight"),
    ("empty receipts on Ack", lambda s, h: s.Ack(ack_req()),
     INVALID, "INVALID_ARGUMENT", "receipts"),
    ("empty receipts on Nack", lambda s, h: s.Nack(nack_req()),
     INVALID, "INVALID_ARGUMENT", "receipts"),
    ("1001 receipts", lambda s, h: s.Ack(ack_req(*[h.w] * 1001)),
     INVALID, "INVALID_ARGUMENT", "receipts"),
    ("nack with retry_after_ms and retry_at_ms",
     lambda s, h: s.Nack(nack_req(h.w, retry_after_ms=10, retry_at_ms=10**13)),
     INVALID, "INVALID_ARGUMENT", "retry_at_ms"),
    ("nack dead with a retry delay",
     lambda s, h: s.Nack(nack_req(h.w, dead=True, retry_after_ms=10)),
     INVALID, "INVALID_ARGUMENT", "dead"),
    ("nack dead without a dead-letter queue",
     lambda s, h: s.Nack(nack_req(h.nodlq, queue="nodlq", dead=True)),
     PRECONDITION, "NO_DEAD_LETTER_QUEUE", "dead"),
    ("CommitOffsets on a work queue",
     lambda s, h: s.CommitOffsets(pb.CommitOffsetsRequest(queue="w", group="g", offsets={0: 1})),
     PRECONDITION, "NOT_A_STREAM_QUEUE", None),
    ("CommitOffsets above the high watermark",
     lambda s, h: s.CommitOffsets(pb.CommitOffsetsRequest(queue="s", group="g", offsets={0: 99})),
     grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE", None),
    ("CommitOffsets of a partition out of range",
     lambda s, h: s.CommitOffsets(pb.CommitOffsetsRequest(queue="s", group="g", offsets={7: 0})),
     INVALID, "PARTITION_OUT_OF_RANGE", "offsets[7]"),
    ("ResetOffsets of a partition out of range",
     lambda s, h: s.ResetOffsets(pb.ResetOffsetsRequest(queue="w", group="g", partitions=[9])),
     INVALID, "PARTITION_OUT_OF_RANGE", "partitions[0]"),
    ("replay without ids or all",
     lambda s, h: s.ReplayDeadLetters(pb.ReplayDeadLettersRequest(queue="w")),
     INVALID, "INVALID_ARGUMENT", "ids"),
    ("empty Transact", lambda s, h: s.Transact(pb.TransactRequest()),
     INVALID, "INVALID_ARGUMENT", "acks"),
]  # fmt: skip


def setup_queues(stub: Stub) -> Held:
    work_queue(stub, "w", partitions=2)
    group(stub, "w", "g")
    group(stub, "w", "g2")
    work_queue(stub, "nodlq", dead_letter_disabled=True)
    group(stub, "nodlq", "g")
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="s", partitions=2)))
    group(stub, "s", "g")
    publish(stub, "w", b"w0", b"w1")
    publish(stub, "nodlq", b"n0")
    publish(stub, "s", b"s0", partition=0)
    (w,) = lease(stub, "w", "g", lease_ms=60_000)
    (w2,) = lease(stub, "w", "g2", lease_ms=60_000)
    (nodlq,) = lease(stub, "nodlq", "g", lease_ms=60_000)
    return Held(w.receipt, w2.receipt, nodlq.receipt)


def test_group_bad_inputs_get_documented_errors_and_change_nothing(stub: Stub) -> None:
    held = setup_queues(stub)
    before = [
        stub.DescribeGroup(pb.DescribeGroupRequest(queue=q, group=g))
        for q, g in (("w", "g"), ("w", "g2"), ("nodlq", "g"), ("s", "g"))
    ]
    failures = []
    for name, call, code, reason, field in CASES:
        try:
            call(stub, held)
        except grpc.RpcError as err:
            e = rich_error(err)
            # The field is a BadRequest violation, or (receipt and DLQ refusals) ErrorInfo's
            # metadata "field".
            named = field is None or field in e.fields or e.metadata.get("field") == field
            if (e.code, e.reason, named) != (code, reason, True):
                failures.append(
                    f"{name}: got {e.code} {e.reason} {e.fields} {e.metadata} ({e.message})"
                )
            if not e.request_id:
                failures.append(f"{name}: no x-request-id in trailers")
        else:
            failures.append(f"{name}: succeeded")
    assert not failures, "\n".join(failures)
    # Nothing changed: the same groups in the same state, every lease still held.
    after = [
        stub.DescribeGroup(pb.DescribeGroupRequest(queue=q, group=g))
        for q, g in (("w", "g"), ("w", "g2"), ("nodlq", "g"), ("s", "g"))
    ]
    assert after == before
    assert [g.name for g in stub.ListGroups(pb.ListGroupsRequest(queue="w")).groups] == ["g", "g2"]
    assert ack(stub, "w", "g", [held.w]) == [ACKED]
    assert ack(stub, "w", "g2", [held.w2]) == [ACKED]
    assert ack(stub, "nodlq", "g", [held.nodlq]) == [ACKED]
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="w")).dead_letters == 0


def test_stale_receipt_is_not_an_error_but_a_per_receipt_status(stub: Stub) -> None:
    """A receipt whose lease expired (and was handed to another consumer) is not refused: Ack
    answers OK with RECEIPT_STATUS_STALE for it and changes nothing for it, so one late
    receipt in a batch does not fail the others. Transact is the exception: all or nothing,
    it refuses with LEASE_NOT_HELD (see test_delivery_api)."""
    work_queue(stub, "st", partitions=1)
    group(stub, "st")
    publish(stub, "st", b"slow", b"ok")
    (old,) = lease(stub, "st", consumer="a", lease_ms=200)
    (good,) = lease(stub, "st", consumer="a", lease_ms=60_000)
    (new,) = lease_all(stub, "st", consumer="b", count=1)
    assert (new.record.value, new.receipt.attempt) == (b"slow", 2)
    resp, call = stub.Ack.with_call(
        pb.AckRequest(queue="st", group="g", receipts=[old.receipt, good.receipt])
    )
    assert call.code() == grpc.StatusCode.OK
    assert list(resp.statuses) == [STALE, ACKED]
    # The stale ack did not touch the new lease.
    assert ack(stub, "st", "g", [new.receipt]) == [ACKED]
