"""QueueService end to end against a real `fluxmq serve` process."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, field_mask_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .rpc_helpers import rich_error

Stub = queue_pb2_grpc.QueueServiceStub


def create(stub: Stub, name: str, **kw: object) -> pb.Queue:
    return stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name, **kw)))  # type: ignore[arg-type]


def test_queue_lifecycle_create_get_update_list_delete(stub: Stub) -> None:
    q = create(stub, "orders", partitions=3, labels={"team": "pay", "env": "prod"})
    assert q.config.partitions == 3 and q.config.dedup_window == "2m" and q.queue_id > 0
    assert stub.GetQueue(pb.GetQueueRequest(name="orders")) == q
    updated = stub.UpdateQueue(
        pb.UpdateQueueRequest(
            config=pb.QueueConfig(
                name="orders", partitions=5, retention=pb.Retention(max_age="1h")
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["partitions"]),
        )
    )
    assert updated.config.partitions == 5 and updated.config.retention.max_age == ""
    assert dict(updated.config.labels) == {"team": "pay", "env": "prod"}
    stub.DeleteQueue(pb.DeleteQueueRequest(name="orders"))
    with pytest.raises(grpc.RpcError) as info:
        stub.GetQueue(pb.GetQueueRequest(name="orders"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_list_queues_filters_by_prefix_and_labels_and_pages(stub: Stub) -> None:
    for i in range(7):
        create(stub, f"app.q{i}", labels={"tier": "gold" if i % 2 else "silver"})
    create(stub, "other")
    seen, token = [], ""
    while True:
        page = stub.ListQueues(pb.ListQueuesRequest(prefix="app.", limit=3, page_token=token))
        assert len(page.queues) <= 3
        seen += [q.config.name for q in page.queues]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"app.q{i}" for i in range(7)]
    gold = stub.ListQueues(pb.ListQueuesRequest(label_selector="tier=gold"))
    assert [q.config.name for q in gold.queues] == ["app.q1", "app.q3", "app.q5"]


def test_publish_then_fetch_returns_byte_identical_records(stub: Stub) -> None:
    create(stub, "s", partitions=4)
    messages = [
        pb.PublishMessage(key=b"k1", value=b"\x00\xffbinary", headers={"h": b"\x01"}),
        pb.PublishMessage(key=b"", value=b"empty key is not no key"),
        pb.PublishMessage(value=b"", partition=3, idempotency_key="id-1"),
    ]
    res = stub.Publish(pb.PublishRequest(queue="s", messages=messages))
    assert len(res.results) == 3
    for msg, r in zip(messages, res.results, strict=True):
        got = stub.Fetch(
            pb.FetchRequest(queue="s", partition=r.partition, offset=r.offset, max_messages=1)
        )
        rec = got.records[0]
        assert (rec.offset, rec.timestamp_ms, rec.value) == (r.offset, r.timestamp_ms, msg.value)
        assert rec.HasField("key") == msg.HasField("key") and rec.key == msg.key
        assert dict(rec.headers) == dict(msg.headers)
        assert rec.idempotency_key == msg.idempotency_key
    assert res.results[2].partition == 3


def test_keyed_messages_keep_their_partition(stub: Stub) -> None:
    create(stub, "keyed", partitions=8)
    res = stub.Publish(
        pb.PublishRequest(
            queue="keyed",
            messages=[pb.PublishMessage(key=b"user-7", value=b"%d" % i) for i in range(20)],
        )
    )
    assert len({r.partition for r in res.results}) == 1
    assert [r.offset for r in res.results] == list(range(20))


def test_keyless_messages_are_spread_round_robin(stub: Stub) -> None:
    create(stub, "rr", partitions=4)
    res = stub.Publish(pb.PublishRequest(queue="rr", messages=[pb.PublishMessage(value=b"x")] * 8))
    assert sorted(r.partition for r in res.results) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_repeated_idempotency_key_is_duplicate_then_new_after_window(stub: Stub) -> None:
    create(stub, "idem", dedup_window="1s")
    m = [pb.PublishMessage(value=b"once", idempotency_key="order-1")]
    first = stub.Publish(pb.PublishRequest(queue="idem", messages=m)).results[0]
    again = stub.Publish(pb.PublishRequest(queue="idem", messages=m)).results[0]
    assert not first.duplicate and again.duplicate
    assert (again.partition, again.offset) == (first.partition, first.offset)
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="idem")).messages == 1
    time.sleep(1.1)
    later = stub.Publish(pb.PublishRequest(queue="idem", messages=m)).results[0]
    assert not later.duplicate and later.offset == first.offset + 1
    assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="idem")).messages == 2


def test_fetch_long_poll_returns_when_data_arrives(stub: Stub) -> None:
    create(stub, "lp")
    empty = stub.Fetch(pb.FetchRequest(queue="lp", offset=0, wait_ms=50))
    assert list(empty.records) == [] and empty.next_offset == 0

    def later() -> None:
        time.sleep(0.3)
        stub.Publish(pb.PublishRequest(queue="lp", messages=[pb.PublishMessage(value=b"hi")]))

    t = threading.Thread(target=later)
    started = time.monotonic()
    t.start()
    got = stub.Fetch(pb.FetchRequest(queue="lp", offset=0, wait_ms=10_000))
    t.join()
    assert [r.value for r in got.records] == [b"hi"]
    assert time.monotonic() - started < 9  # woken by the append, not by the timeout


def test_fetch_respects_max_messages_and_max_bytes(stub: Stub) -> None:
    create(stub, "lim")
    stub.Publish(
        pb.PublishRequest(queue="lim", messages=[pb.PublishMessage(value=b"v" * 100)] * 50)
    )
    assert len(stub.Fetch(pb.FetchRequest(queue="lim", max_messages=7)).records) == 7
    few = stub.Fetch(pb.FetchRequest(queue="lim", max_bytes=1000))
    assert 1 <= len(few.records) < 10 and few.next_offset == len(few.records)
    assert few.high_watermark == 50 and few.low_watermark == 0


def test_tail_streams_from_earliest_and_then_live_records(stub: Stub) -> None:
    create(stub, "tail", partitions=2)
    stub.Publish(
        pb.PublishRequest(
            queue="tail", messages=[pb.PublishMessage(value=b"old%d" % i) for i in range(4)]
        )
    )
    stream = stub.Tail(
        pb.TailRequest(queue="tail", start=pb.StartPosition(earliest=True)), timeout=20
    )
    seen: list[bytes] = []

    def publish_live() -> None:
        time.sleep(0.3)
        stub.Publish(
            pb.PublishRequest(
                queue="tail", messages=[pb.PublishMessage(value=b"new%d" % i) for i in range(4)]
            )
        )

    threading.Thread(target=publish_live).start()
    for resp in stream:
        seen += [r.value for r in resp.records]
        if len(seen) >= 8:
            break
    stream.cancel()
    assert sorted(seen) == sorted(
        [b"old%d" % i for i in range(4)] + [b"new%d" % i for i in range(4)]
    )


def test_tail_from_latest_sees_only_new_records(stub: Stub) -> None:
    create(stub, "tl")
    stub.Publish(pb.PublishRequest(queue="tl", messages=[pb.PublishMessage(value=b"before")]))
    stream = stub.Tail(pb.TailRequest(queue="tl", start=pb.StartPosition(latest=True)), timeout=20)
    threading.Timer(
        0.3,
        lambda: stub.Publish(
            pb.PublishRequest(queue="tl", messages=[pb.PublishMessage(value=b"after")])
        ),
    ).start()
    first = next(iter(stream))
    stream.cancel()
    assert [r.value for r in first.records] == [b"after"]


def test_seek_to_timestamp_finds_first_record_at_or_after(stub: Stub) -> None:
    create(stub, "seek")
    a = stub.Publish(
        pb.PublishRequest(queue="seek", messages=[pb.PublishMessage(value=b"a")])
    ).results[0]
    time.sleep(0.02)
    b = stub.Publish(
        pb.PublishRequest(queue="seek", messages=[pb.PublishMessage(value=b"b")])
    ).results[0]
    assert b.timestamp_ms > a.timestamp_ms

    def seek(ts: int) -> int:
        req = pb.SeekToTimestampRequest(queue="seek", timestamp_ms=ts)
        return int(stub.SeekToTimestamp(req).offset)

    assert seek(0) == 0
    assert seek(a.timestamp_ms + 1) == 1
    assert seek(b.timestamp_ms + 1) == 2  # past the end: the high watermark


def test_purge_removes_everything_and_fetch_below_low_says_so(stub: Stub) -> None:
    create(stub, "pg")
    stub.Publish(pb.PublishRequest(queue="pg", messages=[pb.PublishMessage(value=b"x")] * 10))
    assert stub.PurgeQueue(pb.PurgeQueueRequest(name="pg")).purged_messages == 10
    stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="pg"))
    assert (stats.partitions[0].low_watermark, stats.partitions[0].high_watermark) == (10, 10)
    with pytest.raises(grpc.RpcError) as info:
        stub.Fetch(pb.FetchRequest(queue="pg", offset=3))
    e = rich_error(info.value)
    assert (e.code, e.reason) == (grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE")
    assert e.metadata["low_watermark"] == "10" and "removed by retention" in e.message


def test_publish_stream_answers_in_order_and_survives_a_bad_request(stub: Stub) -> None:
    create(stub, "ps")

    def requests():  # type: ignore[no-untyped-def]
        for i in range(20):
            queue = "missing" if i == 7 else "ps"
            yield pb.PublishStreamRequest(
                sequence=i,
                publish=pb.PublishRequest(
                    queue=queue, messages=[pb.PublishMessage(value=b"%d" % i)]
                ),
            )

    responses = list(stub.PublishStream(requests(), timeout=30))
    assert [r.sequence for r in responses] == list(range(20))
    assert responses[7].error.reason == "QUEUE_NOT_FOUND"
    offsets = [r.results[0].offset for r in responses if not r.HasField("error")]
    assert offsets == list(range(19))


def test_health_and_reflection_list_the_services(node: Node) -> None:
    with node.channel() as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(
            iter(
                stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")])
                )
            )
        )
        names = {s.name for s in resp.list_services_response.service}
    assert {"fluxmq.v1.QueueService", "grpc.health.v1.Health"} <= names
    assert {
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


def _reflect(node: Node, service: str, request: reflection_pb2.ServerReflectionRequest) -> Any:
    """One request to reflection under ``service``'s name (v1 and v1alpha share messages)."""
    with node.channel() as ch:
        call = ch.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        return next(iter(call(iter([request]), timeout=10)))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_serves_the_contract_with_its_comments(node: Node, version: str) -> None:
    """What grpcurl describe shows: the .proto files as written, comments included, under the
    v1 reflection service and the older v1alpha one."""
    service = f"grpc.reflection.{version}.ServerReflection"
    resp = _reflect(
        node,
        service,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="fluxmq.v1.QueueService"),
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in resp.file_descriptor_response.file_descriptor_proto
    ]
    queue_proto = next(f for f in files if f.name == "fluxmq/v1/queue.proto")
    comments = " ".join(loc.leading_comments for loc in queue_proto.source_code_info.location)
    assert "OK means every message is durable" in comments  # Publish's comment
    assert any(f.name.startswith("google/protobuf/") for f in files)  # dependencies too
    listed = _reflect(node, service, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert "fluxmq.v1.AdminService" in {s.name for s in listed.list_services_response.service}
    missing = _reflect(
        node, service, reflection_pb2.ServerReflectionRequest(file_by_filename="nope.proto")
    )
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_sigterm_stops_the_node_cleanly(node: Node) -> None:
    assert node.stop() == 0
