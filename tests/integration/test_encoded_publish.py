"""Publish of records the client encoded (``PublishRequest.encoded``), against a real single node
(raw gRPC stubs): stored as sent and read back record for record, answered with one range, a
producer session's retry answered with its first range, and every refusal with its code and the
field of the record at fault, on Publish and PublishStream alike. The record-level rules are in
tests/unit/test_encoded_records.py."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.client.record_batches import encode_records

from .conftest import Node
from .rpc_helpers import rich_error
from .test_producer_sessions_grpc import fetch_values, init_producer, stream_answers, stream_refusal

Stub = queue_pb2_grpc.QueueServiceStub
RPC_TIMEOUT_S = 10.0
QUEUE = "orders"


def encoded_request(
    values: list[bytes], partition: int = 0, producer: pb.ProducerSession | None = None
) -> pb.PublishRequest:
    messages = [pb.PublishMessage(value=v) for v in values]
    req = pb.PublishRequest(
        queue=QUEUE,
        encoded=pb.EncodedRecords(
            partition=partition, count=len(values), records=encode_records(messages)
        ),
    )
    if producer is not None:
        req.producer.CopyFrom(producer)
    return req


def refusal(stub: Stub, request: pb.PublishRequest) -> tuple[grpc.StatusCode, str, list[str]]:
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(request, timeout=RPC_TIMEOUT_S)
    e = rich_error(info.value)
    return e.code, e.reason, e.fields


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    node = Node(tmp_path_factory.mktemp("encoded") / "node1")
    node.start()
    try:
        with node.channel() as ch:
            yield Stub(ch)
    finally:
        node.stop()


@pytest.fixture
def orders(stub: Stub) -> Iterator[Stub]:
    stub.CreateQueue(
        pb.CreateQueueRequest(
            config=pb.QueueConfig(name=QUEUE, partitions=2, max_message_bytes=1024)
        ),
        timeout=RPC_TIMEOUT_S,
    )
    yield stub
    stub.DeleteQueue(pb.DeleteQueueRequest(name=QUEUE), timeout=RPC_TIMEOUT_S)


def test_encoded_records_are_stored_as_sent_and_answered_with_one_range(orders: Stub) -> None:
    orders.Publish(encoded_request([b"first"], partition=1), timeout=RPC_TIMEOUT_S)
    messages = [
        pb.PublishMessage(value=b"a", key=b"k"),
        pb.PublishMessage(value=b"b", headers={"trace": b"t1", "app": b"x"}),
        pb.PublishMessage(value=b"c"),
    ]
    req = pb.PublishRequest(
        queue=QUEUE,
        encoded=pb.EncodedRecords(partition=1, count=3, records=encode_records(messages)),
    )
    resp = orders.Publish(req, timeout=RPC_TIMEOUT_S)
    assert not resp.results
    b = resp.batch
    assert (b.partition, b.base_offset, b.count, b.duplicate, b.pending) == (1, 1, 3, False, False)
    assert b.timestamp_ms > 0
    fetched = orders.Fetch(
        pb.FetchRequest(queue=QUEUE, partition=1, offset=0, max_messages=10),
        timeout=RPC_TIMEOUT_S,
    )
    got = [(r.offset, r.key if r.HasField("key") else None, r.value, dict(r.headers))
           for r in fetched.records]  # fmt: skip
    assert got == [
        (0, None, b"first", {}),
        (1, b"k", b"a", {}),
        (2, None, b"b", {"trace": b"t1", "app": b"x"}),
        (3, None, b"c", {}),
    ]
    assert all(r.timestamp_ms == b.timestamp_ms for r in fetched.records[1:])
    assert fetch_values(orders, 0) == []


def test_a_sessions_encoded_retry_is_answered_with_its_first_range_and_stored_once(
    orders: Stub,
) -> None:
    grant = init_producer(orders)
    session = pb.ProducerSession(
        producer_id=grant.producer_id, producer_epoch=grant.producer_epoch, first_sequence=0
    )
    req = encoded_request([b"a", b"b"], producer=session)
    first = orders.Publish(req, timeout=RPC_TIMEOUT_S).batch
    again = orders.Publish(req, timeout=RPC_TIMEOUT_S).batch
    assert (first.base_offset, first.count, first.duplicate) == (0, 2, False)
    assert (again.base_offset, again.count, again.timestamp_ms, again.duplicate) == (
        0,
        2,
        first.timestamp_ms,
        True,
    )
    session.first_sequence = 5  # a gap: an earlier request is missing
    code, reason, _ = refusal(orders, encoded_request([b"c"], producer=session))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OUT_OF_ORDER_SEQUENCE")
    assert fetch_values(orders, 0) == [b"a", b"b"]


def test_a_bad_record_is_refused_naming_it_and_nothing_is_stored(orders: Stub) -> None:
    req = encoded_request([b"ok", b"x" * 1025, b"ok"])
    code, reason, fields = refusal(orders, req)
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MESSAGE_TOO_LARGE",
        ["encoded.records[1].value"],
    )
    req = encoded_request([b"ok"])
    req.encoded.count = 2
    assert refusal(orders, req)[2] == ["encoded.records[1]"]
    assert refusal(orders, encoded_request([b"ok"], partition=2))[1] == "PARTITION_OUT_OF_RANGE"
    assert fetch_values(orders, 0) == [] and fetch_values(orders, 1) == []


def test_messages_and_encoded_records_in_one_request_are_refused(orders: Stub) -> None:
    req = encoded_request([b"a"])
    req.messages.add(value=b"b")
    code, _, fields = refusal(orders, req)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["encoded"])
    assert fetch_values(orders, 0) == []


def test_a_transaction_refuses_encoded_records(orders: Stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        orders.Transact(
            pb.TransactRequest(publishes=[encoded_request([b"a"])]), timeout=RPC_TIMEOUT_S
        )
    e = rich_error(info.value)
    assert (e.code, e.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["publishes[0].encoded"])
    assert fetch_values(orders, 0) == []


def test_publish_stream_answers_encoded_records_with_ranges_and_names_a_bad_record(
    orders: Stub,
) -> None:
    answers = stream_answers(
        orders,
        [
            encoded_request([b"a", b"b"]),
            encoded_request([b"c", b"x" * 2000]),
            encoded_request([b"d"], partition=1),
        ],
    )
    assert (answers[0].batch.base_offset, answers[0].batch.count) == (0, 2)
    refused = stream_refusal(answers[1])
    assert (refused.reason, refused.fields) == (
        "MESSAGE_TOO_LARGE",
        ["publish.encoded.records[1].value"],
    )
    assert (answers[2].batch.partition, answers[2].batch.base_offset) == (1, 0)
    assert fetch_values(orders, 0) == [b"a", b"b"]
    assert fetch_values(orders, 1) == [b"d"]
