"""Idempotent producer sessions on the wire, against a real single node (raw gRPC stubs).

``InitProducer`` grants a producer id and epoch; a ``Publish`` carrying the session is answered,
when sent again, with the offsets of its first answer (duplicate=true) and stored once, also
after a kill -9 and restart of the node. Every refusal has its gRPC code, ErrorInfo reason and,
for bad input, the BadRequest field: the same on ``PublishStream`` with ``publish.`` in front.
The state-machine rules themselves are in tests/unit/test_producer_sessions.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.rpc import status_pb2

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core.producers import IDLE_EXPIRY_MS

from .conftest import Node
from .rpc_helpers import rich_error, status_details

Stub = queue_pb2_grpc.QueueServiceStub
RPC_TIMEOUT_S = 10.0
QUEUE = "orders"
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID = grpc.StatusCode.INVALID_ARGUMENT
COPIES = 16


@dataclass(frozen=True)
class Refusal:
    """What a refused request says: the code, the ErrorInfo reason and metadata, the fields."""

    code: grpc.StatusCode
    reason: str
    fields: list[str]
    metadata: dict[str, str]
    retry_delay_ms: int | None


def create_queue(stub: Stub, name: str = QUEUE, partitions: int = 2) -> None:
    stub.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name=name, partitions=partitions)),
        timeout=RPC_TIMEOUT_S,
    )


def init_producer(stub: Stub, name: str = "", queue: str = QUEUE) -> pb.InitProducerResponse:
    resp: pb.InitProducerResponse = stub.InitProducer(
        pb.InitProducerRequest(queue=queue, producer_name=name), timeout=RPC_TIMEOUT_S
    )
    return resp


def session_request(
    grant: pb.InitProducerResponse,
    first_sequence: int,
    values: list[bytes],
    partition: int = 0,
    epoch: int | None = None,
) -> pb.PublishRequest:
    return pb.PublishRequest(
        queue=QUEUE,
        messages=[pb.PublishMessage(value=v, partition=partition) for v in values],
        producer=pb.ProducerSession(
            producer_id=grant.producer_id,
            producer_epoch=grant.producer_epoch if epoch is None else epoch,
            first_sequence=first_sequence,
        ),
    )


def answer(resp: pb.PublishResponse) -> list[tuple[int, int, int, bool]]:
    return [(r.partition, r.offset, r.timestamp_ms, r.duplicate) for r in resp.results]


def fetch_values(stub: Stub, partition: int, queue: str = QUEUE) -> list[bytes]:
    resp = stub.Fetch(
        pb.FetchRequest(queue=queue, partition=partition, offset=0, max_messages=1000),
        timeout=RPC_TIMEOUT_S,
    )
    assert resp.next_offset == resp.high_watermark, "more than one page in a small test"
    return [r.value for r in resp.records]


def refusal(stub: Stub, request: pb.PublishRequest) -> Refusal:
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(request, timeout=RPC_TIMEOUT_S)
    e = rich_error(info.value)
    return Refusal(e.code, e.reason, e.fields, e.metadata, e.retry_delay_ms)


def stream_answers(stub: Stub, requests: list[pb.PublishRequest]) -> list[pb.PublishStreamResponse]:
    sent = (pb.PublishStreamRequest(sequence=i, publish=r) for i, r in enumerate(requests))
    answers = list(stub.PublishStream(sent, timeout=RPC_TIMEOUT_S))
    assert [a.sequence for a in answers] == list(range(len(requests)))
    return answers


def stream_refusal(resp: pb.PublishStreamResponse) -> Refusal:
    assert resp.HasField("error"), resp
    status = status_pb2.Status.FromString(resp.error.status_details)
    d = status_details(status)
    assert d.reason == resp.error.reason and d.domain == "fluxmq"
    return Refusal(
        next(c for c in grpc.StatusCode if c.value[0] == resp.error.code),
        resp.error.reason,
        d.fields,
        d.metadata,
        d.retry_delay_ms,
    )


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    """One node for the tests that do not restart it (a node start costs about a second);
    each test has the queue to itself (``orders`` deletes it after the test)."""
    node = Node(tmp_path_factory.mktemp("sessions") / "node1")
    node.start()
    try:
        with node.channel() as ch:
            yield Stub(ch)
    finally:
        node.stop()


@pytest.fixture
def orders(stub: Stub) -> Iterator[Stub]:
    create_queue(stub)
    yield stub
    stub.DeleteQueue(pb.DeleteQueueRequest(name=QUEUE), timeout=RPC_TIMEOUT_S)


def test_init_producer_grants_an_id_and_a_named_producer_resumes_under_the_next_epoch(
    orders: Stub,
) -> None:
    a, b = init_producer(orders), init_producer(orders)
    assert a.producer_id >= 1 and a.producer_id != b.producer_id
    assert a.producer_epoch == b.producer_epoch == 0
    assert a.idle_expiry_ms == IDLE_EXPIRY_MS
    first = init_producer(orders, "billing")
    again = init_producer(orders, "billing")
    assert again.producer_id == first.producer_id
    assert (first.producer_epoch, again.producer_epoch) == (0, 1)
    assert first.producer_id not in (a.producer_id, b.producer_id)


def test_same_session_request_twice_is_answered_duplicate_with_its_offsets_and_stored_once(
    orders: Stub,
) -> None:
    grant = init_producer(orders)
    orders.Publish(session_request(grant, 0, [b"a"], partition=1), timeout=RPC_TIMEOUT_S)
    req = session_request(grant, 1, [b"b", b"c"], partition=1)
    first = answer(orders.Publish(req, timeout=RPC_TIMEOUT_S))
    second = answer(orders.Publish(req, timeout=RPC_TIMEOUT_S))
    assert [(p, o, d) for p, o, _t, d in first] == [(1, 1, False), (1, 2, False)]
    assert [(p, o, t) for p, o, t, _d in second] == [(p, o, t) for p, o, t, _d in first]
    assert [d for *_x, d in second] == [True, True]
    assert fetch_values(orders, 1) == [b"a", b"b", b"c"]
    assert fetch_values(orders, 0) == []


def test_stale_epoch_is_fenced_failed_precondition_and_not_retriable(orders: Stub) -> None:
    old = init_producer(orders, "billing")
    orders.Publish(session_request(old, 0, [b"a"]), timeout=RPC_TIMEOUT_S)
    new = init_producer(orders, "billing")
    fenced = refusal(orders, session_request(old, 1, [b"zombie"]))
    assert (fenced.code, fenced.reason) == (FAILED_PRECONDITION, "PRODUCER_FENCED")
    assert fenced.metadata["retriable"] == "false" and fenced.retry_delay_ms is None
    assert fenced.metadata["producer_id"] == str(old.producer_id)
    assert fenced.metadata["epoch"] == str(new.producer_epoch)
    # A retry of the old epoch's stored request is answered with its offsets (nothing is
    # stored): what a producer that moved to a new epoch itself needs to tell stored from not.
    again = orders.Publish(session_request(old, 0, [b"a"]), timeout=RPC_TIMEOUT_S)
    assert [(r.offset, r.duplicate) for r in again.results] == [(0, True)]
    orders.Publish(session_request(new, 0, [b"b"]), timeout=RPC_TIMEOUT_S)
    assert fetch_values(orders, 0) == [b"a", b"b"]


def test_unknown_producer_is_refused_failed_precondition(orders: Stub) -> None:
    ghost = pb.InitProducerResponse(producer_id=987_654, producer_epoch=0)
    unknown = refusal(orders, session_request(ghost, 0, [b"a"]))
    assert (unknown.code, unknown.reason) == (FAILED_PRECONDITION, "UNKNOWN_PRODUCER")
    assert unknown.metadata["retriable"] == "false"
    assert unknown.metadata["producer_id"] == "987654"
    assert fetch_values(orders, 0) == []


def test_session_is_unknown_on_another_queue_and_on_a_recreated_queue(orders: Stub) -> None:
    grant = init_producer(orders, "billing")
    orders.Publish(session_request(grant, 0, [b"a"]), timeout=RPC_TIMEOUT_S)
    create_queue(orders, "other", partitions=1)
    elsewhere = session_request(grant, 0, [b"x"])
    elsewhere.queue = "other"
    assert refusal(orders, elsewhere).reason == "UNKNOWN_PRODUCER"
    orders.DeleteQueue(pb.DeleteQueueRequest(name=QUEUE), timeout=RPC_TIMEOUT_S)
    create_queue(orders)
    stale = refusal(orders, session_request(grant, 1, [b"b"]))
    assert (stale.code, stale.reason) == (FAILED_PRECONDITION, "UNKNOWN_PRODUCER")
    orders.DeleteQueue(pb.DeleteQueueRequest(name="other"), timeout=RPC_TIMEOUT_S)
    # The name belongs to the queue it was used on: on the new queue it starts afresh.
    fresh = init_producer(orders, "billing")
    assert fresh.producer_id != grant.producer_id and fresh.producer_epoch == 0
    assert fetch_values(orders, 0) == []


def test_sequence_gap_is_out_of_order_failed_precondition_and_retriable(orders: Stub) -> None:
    grant = init_producer(orders)
    orders.Publish(session_request(grant, 0, [b"a", b"b"]), timeout=RPC_TIMEOUT_S)
    gap = refusal(orders, session_request(grant, 5, [b"x"]))
    assert (gap.code, gap.reason) == (FAILED_PRECONDITION, "OUT_OF_ORDER_SEQUENCE")
    assert gap.metadata["retriable"] == "true"
    assert gap.metadata["expected_sequence"] == "2"
    assert gap.retry_delay_ms is not None and gap.retry_delay_ms > 0
    assert fetch_values(orders, 0) == [b"a", b"b"]


def _bad_session_requests(grant: pb.InitProducerResponse) -> list[tuple[pb.PublishRequest, str]]:
    session = pb.ProducerSession(producer_id=grant.producer_id, producer_epoch=grant.producer_epoch)
    two_partitions = pb.PublishRequest(
        queue=QUEUE,
        messages=[
            pb.PublishMessage(value=b"a", partition=0),
            pb.PublishMessage(value=b"b", partition=1),
        ],
        producer=session,
    )
    no_partition = pb.PublishRequest(
        queue=QUEUE, messages=[pb.PublishMessage(value=b"a")], producer=session
    )
    with_key = pb.PublishRequest(
        queue=QUEUE,
        messages=[pb.PublishMessage(value=b"a", partition=0, idempotency_key="k")],
        producer=session,
    )
    zero_id = session_request(pb.InitProducerResponse(producer_id=0), 0, [b"a"])
    future_epoch = session_request(grant, 0, [b"a"], epoch=grant.producer_epoch + 7)
    beyond = session_request(grant, 2**64 - 1, [b"a"])
    return [
        (two_partitions, "messages[1].partition"),
        (no_partition, "messages[0].partition"),
        (with_key, "messages[0].idempotency_key"),
        (zero_id, "producer.producer_id"),
        (future_epoch, "producer.producer_epoch"),
        (beyond, "producer.first_sequence"),
    ]


def test_bad_session_requests_are_invalid_argument_naming_the_field(orders: Stub) -> None:
    grant = init_producer(orders)
    failures = []
    for req, field in _bad_session_requests(grant):
        got = refusal(orders, req)
        if (got.code, got.reason, got.fields) != (INVALID, "INVALID_ARGUMENT", [field]):
            failures.append(f"{field}: {got}")
    assert not failures, "\n".join(failures)
    assert fetch_values(orders, 0) == [] and fetch_values(orders, 1) == []
    # None of the refusals consumed a sequence number: the session starts at 0 still.
    ok = orders.Publish(session_request(grant, 0, [b"ok"]), timeout=RPC_TIMEOUT_S)
    assert [r.offset for r in ok.results] == [0]


def test_init_producer_with_an_invalid_name_names_producer_name(orders: Stub) -> None:
    for name in ("a/b", "x" * 201, "sp ace"):
        with pytest.raises(grpc.RpcError) as info:
            init_producer(orders, name)
        e = rich_error(info.value)
        assert (e.code, e.reason, e.fields) == (INVALID, "INVALID_ARGUMENT", ["producer_name"])


def test_init_producer_on_a_missing_queue_is_not_found(stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        init_producer(stub, "p", queue="nope")
    e = rich_error(info.value)
    assert (e.code, e.reason) == (grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND")
    with pytest.raises(grpc.RpcError) as info:
        init_producer(stub, "p", queue="")
    e = rich_error(info.value)
    assert (e.code, e.reason, e.fields) == (INVALID, "INVALID_ARGUMENT", ["queue"])


def test_concurrent_copies_of_a_session_request_are_stored_once(orders: Stub) -> None:
    """A client that resends while its first attempt is still in flight (its deadline passed,
    the answer is slow): every copy gets the one stored copy's offsets."""
    grant = init_producer(orders)
    orders.Publish(session_request(grant, 0, [b"a"]), timeout=RPC_TIMEOUT_S)
    req = session_request(grant, 1, [b"b", b"c"])
    calls = [orders.Publish.future(req, timeout=RPC_TIMEOUT_S) for _ in range(COPIES)]
    answers = [answer(c.result()) for c in calls]
    assert {tuple((p, o, t) for p, o, t, _d in a) for a in answers} == {
        ((0, 1, answers[0][0][2]), (0, 2, answers[0][1][2]))
    }
    assert sorted(a[0][3] for a in answers) == [False] + [True] * (COPIES - 1)
    assert fetch_values(orders, 0) == [b"a", b"b", b"c"]


def test_transact_with_a_producer_session_is_refused_naming_the_publish(orders: Stub) -> None:
    grant = init_producer(orders)
    with pytest.raises(grpc.RpcError) as info:
        orders.Transact(
            pb.TransactRequest(
                publishes=[
                    pb.PublishRequest(queue=QUEUE, messages=[pb.PublishMessage(value=b"t")]),
                    session_request(grant, 0, [b"s"]),
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )
    e = rich_error(info.value)
    assert (e.code, e.reason, e.fields) == (INVALID, "INVALID_ARGUMENT", ["publishes[1].producer"])
    assert fetch_values(orders, 0) == [] and fetch_values(orders, 1) == []


def test_publish_stream_answers_a_resent_session_request_duplicate_with_its_offsets(
    orders: Stub,
) -> None:
    grant = init_producer(orders)
    req = session_request(grant, 0, [b"a", b"b"], partition=1)
    first, again = stream_answers(orders, [req, req])
    assert not first.HasField("error") and not again.HasField("error")
    assert [r.offset for r in first.results] == [0, 1]
    assert [(r.offset, r.timestamp_ms) for r in again.results] == [
        (r.offset, r.timestamp_ms) for r in first.results
    ]
    assert [r.duplicate for r in again.results] == [True, True]
    # A later stream, as after a reconnect, gets the same answer.
    (later,) = stream_answers(orders, [req])
    assert [(r.offset, r.duplicate) for r in later.results] == [(0, True), (1, True)]
    assert fetch_values(orders, 1) == [b"a", b"b"]


def test_publish_stream_refusals_have_the_unary_code_and_reason_and_name_publish_fields(
    orders: Stub,
) -> None:
    old = init_producer(orders, "billing")
    orders.Publish(session_request(old, 0, [b"a"]), timeout=RPC_TIMEOUT_S)
    new = init_producer(orders, "billing")
    orders.Publish(session_request(new, 0, [b"b"]), timeout=RPC_TIMEOUT_S)
    ghost = pb.InitProducerResponse(producer_id=987_654)
    bad = _bad_session_requests(new)
    answers = stream_answers(
        orders,
        [
            session_request(old, 1, [b"zombie"]),
            session_request(ghost, 0, [b"x"]),
            session_request(new, 9, [b"gap"]),
            *(req for req, _field in bad),
            session_request(new, 1, [b"c"]),  # the stream goes on after refusals
        ],
    )
    fenced, unknown, gap, *invalid, ok = answers
    got = stream_refusal(fenced)
    assert (got.code, got.reason, got.metadata["retriable"]) == (
        FAILED_PRECONDITION, "PRODUCER_FENCED", "false",
    )  # fmt: skip
    got = stream_refusal(unknown)
    assert (got.code, got.reason) == (FAILED_PRECONDITION, "UNKNOWN_PRODUCER")
    got = stream_refusal(gap)
    assert (got.code, got.reason, got.metadata["retriable"]) == (
        FAILED_PRECONDITION, "OUT_OF_ORDER_SEQUENCE", "true",
    )  # fmt: skip
    assert got.metadata["expected_sequence"] == "1"
    failures = []
    for resp, (_req, field) in zip(invalid, bad, strict=True):
        got = stream_refusal(resp)
        if (got.code, got.reason, got.fields) != (
            INVALID,
            "INVALID_ARGUMENT",
            [f"publish.{field}"],
        ):
            failures.append(f"publish.{field}: {got}")
    assert not failures, "\n".join(failures)
    assert not ok.HasField("error") and [r.offset for r in ok.results] == [2]
    assert fetch_values(orders, 0) == [b"a", b"b", b"c"] and fetch_values(orders, 1) == []


def test_session_state_survives_a_kill9_and_restart_of_the_node(node: Node) -> None:
    with node.channel() as ch:
        s = Stub(ch)
        create_queue(s)
        grant = init_producer(s, "durable")
        s.Publish(session_request(grant, 0, [b"a", b"b"]), timeout=RPC_TIMEOUT_S)
        last = session_request(grant, 2, [b"c"])
        before = answer(s.Publish(last, timeout=RPC_TIMEOUT_S))
    node.kill9()
    node.start()
    with node.channel() as ch:
        s = Stub(ch)
        after = answer(s.Publish(last, timeout=RPC_TIMEOUT_S))
        assert [(p, o, t) for p, o, t, _d in after] == [(p, o, t) for p, o, t, _d in before]
        assert [d for *_x, d in after] == [True] and [d for *_x, d in before] == [False]
        # The sequence goes on where it stopped, and a gap is still a gap.
        gap = refusal(s, session_request(grant, 5, [b"x"]))
        assert gap.reason == "OUT_OF_ORDER_SEQUENCE" and gap.metadata["expected_sequence"] == "3"
        nxt = s.Publish(session_request(grant, 3, [b"d"]), timeout=RPC_TIMEOUT_S)
        assert [(r.offset, r.duplicate) for r in nxt.results] == [(3, False)]
        # The name's epoch survived too: the next InitProducer fences the pre-restart epoch.
        resumed = init_producer(s, "durable")
        assert (resumed.producer_id, resumed.producer_epoch) == (grant.producer_id, 1)
        assert fetch_values(s, 0) == [b"a", b"b", b"c", b"d"]
