"""Bad input inside a nested request (a Transact's acks and publishes, a PublishStream's publish)
names the complete field path, the same in BadRequest, in ErrorInfo's "field" and in the text,
and the broker changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.rpc import status_pb2

from fluxmq._pb.v1 import queue_pb2 as pb

from .delivery_helpers import ACKED, Stub, ack, group, lease, publish, work_queue
from .rpc_helpers import rich_error, status_details

INVALID = grpc.StatusCode.INVALID_ARGUMENT
LIMIT_BYTES = 64


def ok_publish(queue: str = "w") -> pb.PublishRequest:
    return pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=b"fine")])


def big(n: int = 1) -> list[pb.PublishMessage]:
    return [pb.PublishMessage(value=b"x" * (LIMIT_BYTES + 1)) for _ in range(n)]


def transact(acks: list[pb.AckRequest], publishes: list[pb.PublishRequest]) -> Any:
    return lambda s, r: s.Transact(pb.TransactRequest(acks=acks, publishes=publishes))


def ack_of(r: pb.Receipt, **kw: Any) -> pb.AckRequest:
    return pb.AckRequest(**{"queue": "w", "group": "g", "receipts": [r], **kw})


Case = tuple[str, Callable[[Stub, pb.Receipt], Any], grpc.StatusCode, str, str]

TRANSACT_CASES: list[Case] = [
    ("too-large value in the second publish",
     lambda s, r: s.Transact(pb.TransactRequest(
         publishes=[ok_publish(), pb.PublishRequest(queue="w", messages=big())])),
     INVALID, "MESSAGE_TOO_LARGE", "publishes[1].messages[0].value"),
    ("partition out of range in a publish",
     lambda s, r: s.Transact(pb.TransactRequest(publishes=[pb.PublishRequest(
         queue="w",
         messages=[pb.PublishMessage(value=b"v"), pb.PublishMessage(value=b"v", partition=7)])])),
     INVALID, "PARTITION_OUT_OF_RANGE", "publishes[0].messages[1].partition"),
    ("a publish with no messages",
     lambda s, r: s.Transact(pb.TransactRequest(
         publishes=[ok_publish(), pb.PublishRequest(queue="w")])),
     INVALID, "INVALID_ARGUMENT", "publishes[1].messages"),
    ("reserved header in a publish",
     lambda s, r: s.Transact(pb.TransactRequest(publishes=[pb.PublishRequest(
         queue="w", messages=[pb.PublishMessage(value=b"v", headers={"fluxmq-x": b"1"})])])),
     INVALID, "INVALID_ARGUMENT", "publishes[0].messages[0].headers[fluxmq-x]"),
    ("bad queue name in a publish",
     lambda s, r: s.Transact(pb.TransactRequest(
         publishes=[ok_publish(), pb.PublishRequest(queue="a/b", messages=big())])),
     INVALID, "INVALID_ARGUMENT", "publishes[1].queue"),
    ("bad group name in an ack",
     lambda s, r: s.Transact(pb.TransactRequest(acks=[ack_of(r, group="no spaces")])),
     INVALID, "INVALID_ARGUMENT", "acks[0].group"),
    ("bad queue name in an ack",
     lambda s, r: s.Transact(pb.TransactRequest(acks=[ack_of(r), ack_of(r, queue="a/b")])),
     INVALID, "INVALID_ARGUMENT", "acks[1].queue"),
    ("too-long member_id in an ack",
     lambda s, r: s.Transact(pb.TransactRequest(acks=[ack_of(r, member_id="m" * 300)])),
     INVALID, "INVALID_ARGUMENT", "acks[0].member_id"),
    ("an ack without receipts",
     lambda s, r: s.Transact(pb.TransactRequest(
         acks=[ack_of(r), pb.AckRequest(queue="w", group="g")])),
     INVALID, "INVALID_ARGUMENT", "acks[1].receipts"),
    ("a foreign receipt in the second ack",
     lambda s, r: s.Transact(pb.TransactRequest(acks=[ack_of(r), ack_of(r, group="g2")])),
     INVALID, "RECEIPT_MISMATCH", "acks[1].receipts[0]"),
]  # fmt: skip


def setup(stub: Stub) -> pb.Receipt:
    work_queue(stub, "w", partitions=2, max_message_bytes=LIMIT_BYTES)
    group(stub, "w", "g")
    group(stub, "w", "g2")
    publish(stub, "w", b"w0")
    (held,) = lease(stub, "w", "g", lease_ms=60_000)
    return held.receipt


def names_everywhere(field: str, fields: list[str], metadata: dict[str, str], text: str) -> bool:
    """The field is in BadRequest (when there is one), in ErrorInfo's "field" (when set) and
    at least one of the two, and the text names it."""
    in_metadata = metadata.get("field", field) == field
    in_bad_request = not fields or fields == [field]
    return in_metadata and in_bad_request and (fields or "field" in metadata) and field in text


def test_transact_violations_name_the_complete_field_path(stub: Stub) -> None:
    receipt = setup(stub)
    failures = []
    for name, call, code, reason, field in TRANSACT_CASES:
        try:
            call(stub, receipt)
        except grpc.RpcError as err:
            e = rich_error(err)
            named = names_everywhere(field, e.fields, e.metadata, e.message)
            if (e.code, e.reason, named) != (code, reason, True):
                failures.append(
                    f"{name}: got {e.code} {e.reason} {e.fields} {e.metadata} ({e.message})"
                )
        else:
            failures.append(f"{name}: succeeded")
    assert not failures, "\n".join(failures)
    # All or nothing: no refused transaction wrote or acked anything.
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="w")).messages == 1
    assert ack(stub, "w", "g", [receipt]) == [ACKED]


def stream_error(
    stub: Stub, publish_req: pb.PublishRequest
) -> tuple[str, list[str], dict[str, str], str]:
    (resp,) = list(
        stub.PublishStream(
            iter([pb.PublishStreamRequest(sequence=1, publish=publish_req)]), timeout=10
        )
    )
    assert resp.HasField("error"), resp
    status = status_pb2.Status.FromString(resp.error.status_details)
    details = status_details(status)
    assert status.message == resp.error.message
    return resp.error.reason, details.fields, details.metadata, resp.error.message


def test_publish_stream_violations_name_the_field_inside_publish(stub: Stub) -> None:
    work_queue(stub, "w", partitions=2, max_message_bytes=LIMIT_BYTES)
    cases = [
        (pb.PublishRequest(queue="w", messages=[pb.PublishMessage(value=b"v"), *big()]),
         "MESSAGE_TOO_LARGE", "publish.messages[1].value"),
        (pb.PublishRequest(queue="w", messages=[pb.PublishMessage(value=b"v", partition=5)]),
         "PARTITION_OUT_OF_RANGE", "publish.messages[0].partition"),
        (pb.PublishRequest(queue="w", messages=big(), request_timeout_ms=5),
         "INVALID_ARGUMENT", "publish.request_timeout_ms"),
        (pb.PublishRequest(queue="a/b", messages=big()), "INVALID_ARGUMENT", "publish.queue"),
    ]  # fmt: skip
    failures = []
    for req, reason, field in cases:
        got_reason, fields, metadata, text = stream_error(stub, req)
        if (got_reason, names_everywhere(field, fields, metadata, text)) != (reason, True):
            failures.append(f"{field}: got {got_reason} {fields} {metadata} ({text})")
    assert not failures, "\n".join(failures)
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="w")).messages == 0
