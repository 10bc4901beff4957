"""Several shard processes behind one front end: the queue a call names is read from its bytes,
the front end's table follows the shard processes' reports, each report reaches the others, and
a call reaches the shard process that holds its queue (a real grpc.aio front end on loopback,
FramedServers on socket pairs)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.daemon import combined_health
from fluxmq.server.shard_process.frames import FrameError
from fluxmq.server.shard_process.front import (
    RELAYED_SERVICES,
    QueueReports,
    RelayHandler,
    ShardProcessLink,
)
from fluxmq.server.shard_process.routing import (
    CallRouting,
    length_delimited_field,
    queue_field_path,
    string_at,
)
from fluxmq.server.shard_process.shard_server import FramedServer
from fluxmq.server.shard_process.siblings import (
    QueueTable,
    Siblings,
    decode_report,
    encode_report,
    home_process,
    local_shard_id,
    local_shard_index,
    sibling_address,
    split_address,
)

SERVICE = "fluxmq.v1.QueueService"
FRAME_BYTES_MAX = 8 * 1024 * 1024
PUBLISH = f"/{SERVICE}/Publish"


def routing(count: int) -> CallRouting:
    return CallRouting(QueueTable(count), RELAYED_SERVICES)


def test_the_queue_is_read_from_the_request_bytes_of_every_method_that_names_one() -> None:
    big = pb.PublishRequest(queue="orders", messages=[pb.PublishMessage(value=b"v" * 100)] * 50)
    assert string_at(big.SerializeToString(), (1,)) == "orders"
    create = pb.CreateQueueRequest(config=pb.QueueConfig(name="payments", partitions=4))
    path = queue_field_path(pb.CreateQueueRequest.DESCRIPTOR)
    assert path is not None and string_at(create.SerializeToString(), path) == "payments"
    for message in (pb.FetchRequest, pb.AckRequest, pb.TailRequest, pb.GetQueueRequest):
        assert queue_field_path(message.DESCRIPTOR) is not None, message
    assert queue_field_path(pb.ListQueuesRequest.DESCRIPTOR) is None


def test_bytes_that_do_not_parse_name_no_queue() -> None:
    assert length_delimited_field(b"\x0a\x50short", 1) is None  # a length past the end
    assert length_delimited_field(b"\x0f", 1) is None  # wire type 7
    assert length_delimited_field(b"\x0a\x02\xff\xfe", 1) == b"\xff\xfe"
    assert string_at(b"\x0a\x02\xff\xfe", (1,)) is None  # not UTF-8
    assert routing(2).process_for(PUBLISH, b"\x0a\x50short") == 0


def test_a_call_goes_where_its_queue_was_reported_else_where_it_would_be_created() -> None:
    calls = routing(2)
    moved = next(n for n in (f"q{i}" for i in range(100)) if home_process(n, 2) == 0)
    body = pb.PublishRequest(queue=moved).SerializeToString()
    assert calls.process_for(PUBLISH, body) == 0
    calls.table.update(1, {"local-1": [moved]})
    assert calls.process_for(PUBLISH, body) == 1
    calls.table.update(1, {"local-1": []})  # deleted there
    assert calls.process_for(PUBLISH, body) == 0


def test_a_transaction_goes_where_its_first_queue_is() -> None:
    calls = routing(4)
    calls.table.update(3, {"local-3": ["a-queue"]})
    transact = pb.TransactRequest(
        publishes=[pb.PublishRequest(queue="z-queue"), pb.PublishRequest(queue="a-queue")]
    )
    assert calls.process_for(f"/{SERVICE}/Transact", transact.SerializeToString()) == 3


def test_every_create_goes_to_the_first_shard_process_which_places_it() -> None:
    calls = routing(3)
    config = pb.QueueConfig(name="anything")
    config.replication.group = "local-2"
    create = pb.CreateQueueRequest(config=config).SerializeToString()
    assert calls.process_for(f"/{SERVICE}/CreateQueue", create) == 0


def test_one_shard_process_takes_every_call() -> None:
    assert routing(1).process_for(PUBLISH, pb.PublishRequest(queue="x").SerializeToString()) == 0


def test_local_shard_ids_and_sibling_addresses_round_trip() -> None:
    for index in (0, 1, 12):
        assert local_shard_index(local_shard_id(index)) == index
    assert local_shard_index("local-01") is None and local_shard_index("group-1") is None
    assert split_address(sibling_address("/run/f/front.sock", 3)) == ("unix:/run/f/front.sock", 3)
    assert split_address("10.0.0.1:7070") == ("10.0.0.1:7070", None)


def test_a_report_round_trips_and_a_damaged_one_is_a_frame_error() -> None:
    assert decode_report(encode_report({"local-1": ["b", "a"]}, 1)) == (1, {"local-1": ["a", "b"]})
    assert decode_report(encode_report({"local": []})) == (None, {"local": []})
    for bad in (b"{", b"[]", b'{"shards": 3}', b'{"shards": {}, "process": "x"}'):
        with pytest.raises(FrameError):
            decode_report(bad)


def test_siblings_know_the_other_processes_queues_not_their_own() -> None:
    siblings = Siblings(0, 3, "/s")
    siblings.update(0, {"local": ["mine"]})
    siblings.update(2, {"local-2": ["a", "b"]})
    assert siblings.owner("mine") is None
    assert siblings.owner("a") == (2, "local-2")
    siblings.update(2, {"local-2": ["b"]})
    assert siblings.owner("a") is None and siblings.owner("b") == (2, "local-2")
    assert siblings.others() == [1, 2]


def test_the_port_serves_a_service_only_while_every_shard_process_does() -> None:
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    both = [{"": serving, SERVICE: serving}, {"": serving, SERVICE: serving}]
    assert combined_health(both) == {"": serving, SERVICE: serving}
    one_down = [{"": serving, SERVICE: serving}, {"": serving, SERVICE: not_serving}]
    assert combined_health(one_down) == {"": serving, SERVICE: not_serving}
    assert combined_health([{"": serving, SERVICE: serving}, {}])[SERVICE] == not_serving


class Shard:
    """A shard process's stand-in: answers Publish with its own number as the offset."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.routes: list[tuple[int | None, dict[str, list[str]]]] = []
        self.server = FramedServer([], frame_bytes_max=FRAME_BYTES_MAX)
        self.server.on_routes = lambda payload: self.routes.append(decode_report(payload))
        handlers = {
            "Publish": grpc.unary_unary_rpc_method_handler(
                self.publish,
                request_deserializer=pb.PublishRequest.FromString,
                response_serializer=pb.PublishResponse.SerializeToString,
            ),
            "PublishStream": grpc.stream_stream_rpc_method_handler(
                self.publish_stream,
                request_deserializer=pb.PublishStreamRequest.FromString,
                response_serializer=pb.PublishStreamResponse.SerializeToString,
            ),
        }
        self.server.add_registered_method_handlers(SERVICE, handlers)

    async def publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        return pb.PublishResponse(results=[pb.PublishResult(offset=self.index)])

    async def publish_stream(self, requests: Any, context: Any) -> Any:
        async for req in requests:
            yield pb.PublishStreamResponse(sequence=req.sequence * 10 + self.index)


async def test_calls_reach_the_shard_process_that_reported_their_queue() -> None:
    shards = [Shard(0), Shard(1)]
    links = [ShardProcessLink(FRAME_BYTES_MAX, 1 << 20) for _ in shards]
    reports = QueueReports(links)
    front = grpc.aio.server()
    front.add_generic_rpc_handlers(
        (RelayHandler(links, RELAYED_SERVICES, CallRouting(reports.table, RELAYED_SERVICES)),)
    )
    port = front.add_insecure_port("127.0.0.1:0")
    for index, (shard, link) in enumerate(zip(shards, links, strict=True)):
        front_end, shard_end = socket.socketpair()
        await link.attach(front_end)
        await shard.server.serve(shard_end)
        reports.on_attached(index)
        shard.server.send_health((("", "1"),))
    # Names whose hash puts them in process 0, reported by process 1 (created when the node
    # had another count of shard processes).
    names = [n for n in (f"q{i}" for i in range(100)) if home_process(n, 2) == 0][:2]
    shards[1].server.send_queues(encode_report({"local-1": [names[0]]}))
    await front.start()
    try:
        await routed_through(front, port, shards, links, names)
    finally:
        await front.stop(0)
        for link in links:
            link.detach()


async def routed_through(
    front: grpc.aio.Server, port: int, shards: list[Shard], links: list[Any], names: list[str]
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        report = (1, {"local-1": [names[0]]})
        for _ in range(100):
            if all(link.attached for link in links) and report in shards[0].routes:
                break
            await asyncio.sleep(0.01)
        assert shards[0].routes[-1] == report  # passed on to the other shard process
        publish = channel.unary_unary(
            PUBLISH,
            request_serializer=pb.PublishRequest.SerializeToString,
            response_deserializer=pb.PublishResponse.FromString,
        )
        reached = [(await publish(pb.PublishRequest(queue=n))).results[0].offset for n in names]
        assert reached == [1, 0]
        stream = channel.stream_stream(
            f"/{SERVICE}/PublishStream",
            request_serializer=pb.PublishStreamRequest.SerializeToString,
            response_deserializer=pb.PublishStreamResponse.FromString,
        )

        async def requests() -> Any:
            for sequence in (1, 2):  # the stream goes where its first request's queue is
                yield pb.PublishStreamRequest(
                    sequence=sequence, publish=pb.PublishRequest(queue=names[0])
                )

        answers = [r.sequence async for r in stream(requests())]
        assert answers == [11, 21]
