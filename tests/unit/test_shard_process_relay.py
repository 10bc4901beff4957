"""The relay from a front end's gRPC port to a shard process, in one process: a real grpc.aio
server with the RelayHandler on loopback, and a FramedServer on the other end of a socket pair
serving test behaviours under the same method names. What a client sees must be what the
shard side did: answers and trailers, errors with their details, streams with back-pressure,
cancellations reaching the shard side, and a shard process that dies mid-call."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.server.shard_process import frames as fr
from fluxmq.server.shard_process.front import (
    _END,
    RELAYED_SERVICES,
    RelayHandler,
    ShardProcessLink,
)
from fluxmq.server.shard_process.shard_server import STREAM_WINDOW, FramedServer

SERVICE = "fluxmq.v1.QueueService"
FRAME_BYTES_MAX = 8 * 1024 * 1024
BIG = b"x" * 1000
BUFFERED_BYTES_MAX = 1024 * 1024


class Behaviours:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.sent = 0
        self.release = asyncio.Event()

    async def publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        context.set_trailing_metadata((("x-fluxmq-leader", "127.0.0.1:1"),))
        return pb.PublishResponse(
            results=[pb.PublishResult(offset=i) for i, _ in enumerate(request.messages)]
        )

    async def get_queue(self, request: pb.GetQueueRequest, context: Any) -> pb.Queue:
        info = error_details_pb2.ErrorInfo(reason="QUEUE_NOT_FOUND", domain="fluxmq")
        status = status_pb2.Status(code=grpc.StatusCode.NOT_FOUND.value[0], message="no such queue")
        status.details.add().Pack(info)
        await context.abort_with_status(rpc_status.to_status(status))
        raise AssertionError("abort returns only by raising")

    async def tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.TailResponse]:
        try:
            for i in range(request.max_messages or 10):
                self.sent += 1
                yield pb.TailResponse(records=[pb.Record(offset=i, value=BIG)])
                if i == 5:
                    await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def publish_stream(
        self, requests: AsyncIterator[pb.PublishStreamRequest], context: Any
    ) -> AsyncIterator[pb.PublishStreamResponse]:
        async for req in requests:
            yield pb.PublishStreamResponse(sequence=req.sequence)


def shard_server(behaviours: Behaviours) -> FramedServer:
    server = FramedServer([], frame_bytes_max=FRAME_BYTES_MAX)
    handlers = {
        "Publish": grpc.unary_unary_rpc_method_handler(
            behaviours.publish,
            request_deserializer=pb.PublishRequest.FromString,
            response_serializer=pb.PublishResponse.SerializeToString,
        ),
        "GetQueue": grpc.unary_unary_rpc_method_handler(
            behaviours.get_queue,
            request_deserializer=pb.GetQueueRequest.FromString,
            response_serializer=pb.Queue.SerializeToString,
        ),
        "Tail": grpc.unary_stream_rpc_method_handler(
            behaviours.tail,
            request_deserializer=pb.TailRequest.FromString,
            response_serializer=pb.TailResponse.SerializeToString,
        ),
        "PublishStream": grpc.stream_stream_rpc_method_handler(
            behaviours.publish_stream,
            request_deserializer=pb.PublishStreamRequest.FromString,
            response_serializer=pb.PublishStreamResponse.SerializeToString,
        ),
    }
    server.add_registered_method_handlers(SERVICE, handlers)
    return server


class Relay:
    def __init__(self) -> None:
        self.behaviours = Behaviours()
        self.link = ShardProcessLink(FRAME_BYTES_MAX, BUFFERED_BYTES_MAX)
        self.shard = shard_server(self.behaviours)
        self.front = grpc.aio.server()
        self.front.add_generic_rpc_handlers((RelayHandler([self.link], RELAYED_SERVICES),))
        self.port = self.front.add_insecure_port("127.0.0.1:0")
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> Relay:
        front_end, shard_end = socket.socketpair()
        await self.link.attach(front_end)
        await self.shard.serve(shard_end)
        self.shard.send_health((("", "1"),))  # a shard process serves once it says so
        await self.front.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        for _ in range(100):
            if self.link.attached:
                break
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.channel is not None
        await self.channel.close()
        await self.front.stop(0)
        self.link.detach()

    def method(self, name: str, request_cls: Any, response_cls: Any, kind: str) -> Any:
        assert self.channel is not None
        make = getattr(self.channel, kind)
        return make(
            f"/{SERVICE}/{name}",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )


async def test_a_unary_answer_and_its_trailers_reach_the_client() -> None:
    async with Relay() as relay:
        call = relay.method("Publish", pb.PublishRequest, pb.PublishResponse, "unary_unary")(
            pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"a")] * 3)
        )
        response = await call
        assert [r.offset for r in response.results] == [0, 1, 2]
        assert ("x-fluxmq-leader", "127.0.0.1:1") in tuple(await call.trailing_metadata())


async def test_an_error_reaches_the_client_with_its_code_and_details() -> None:
    async with Relay() as relay:
        get = relay.method("GetQueue", pb.GetQueueRequest, pb.Queue, "unary_unary")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get(pb.GetQueueRequest(name="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "no such queue"
        status = rpc_status.from_call(err.value)
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        status.details[0].Unpack(info)
        assert info.reason == "QUEUE_NOT_FOUND"


async def test_an_unknown_method_is_unimplemented() -> None:
    async with Relay() as relay:
        ack = relay.method("Ack", pb.AckRequest, pb.AckResponse, "unary_unary")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ack(pb.AckRequest(queue="q"))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_stream_that_nobody_reads_stops_at_the_window() -> None:
    async with Relay() as relay:
        relay.behaviours.release.set()
        link = relay.link
        request = pb.TailRequest(queue="q", max_messages=10 * STREAM_WINDOW).SerializeToString()
        call_id, state = link.open(
            fr.Call(f"/{SERVICE}/Tail", None, fr.Shape.UNARY_STREAM, (), request)
        )
        await asyncio.sleep(0.3)  # nobody takes the answers
        assert state.items.qsize() == STREAM_WINDOW
        assert relay.behaviours.sent <= STREAM_WINDOW + 1  # one more made, waiting for credit
        for _ in range(STREAM_WINDOW // 2):  # taking half the window grants it again
            await link.next_item(call_id, state)
        await asyncio.sleep(0.3)
        assert state.items.qsize() == STREAM_WINDOW
        taken = STREAM_WINDOW // 2
        while (await link.next_item(call_id, state)) is not _END:
            taken += 1
        assert taken == 10 * STREAM_WINDOW
        assert state.end is not None and state.end.code == 0


async def test_a_cancelled_stream_is_cancelled_on_the_shard_side() -> None:
    async with Relay() as relay:
        tail = relay.method("Tail", pb.TailRequest, pb.TailResponse, "unary_stream")
        call = tail(pb.TailRequest(queue="q", max_messages=100))
        for _ in range(6):
            await call.read()
        call.cancel()
        await asyncio.wait_for(relay.behaviours.cancelled.wait(), 5)


async def test_a_bidirectional_stream_relays_both_ways() -> None:
    async with Relay() as relay:
        stream = relay.method(
            "PublishStream", pb.PublishStreamRequest, pb.PublishStreamResponse, "stream_stream"
        )

        async def requests() -> AsyncIterator[pb.PublishStreamRequest]:
            for i in range(3 * STREAM_WINDOW):
                yield pb.PublishStreamRequest(sequence=i)

        got = [r.sequence async for r in stream(requests())]
        assert got == list(range(3 * STREAM_WINDOW))


async def test_a_call_in_flight_when_the_shard_process_dies_is_outcome_unknown() -> None:
    async with Relay() as relay:
        tail = relay.method("Tail", pb.TailRequest, pb.TailResponse, "unary_stream")
        call = tail(pb.TailRequest(queue="q", max_messages=100))
        for _ in range(6):
            await call.read()
        relay.link.detach()  # what the supervisor does when the process exits
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while (await call.read()) is not grpc.aio.EOF:
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "OUTCOME_UNKNOWN" in str(err.value.trailing_metadata())
        publish = relay.method("Publish", pb.PublishRequest, pb.PublishResponse, "unary_unary")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await publish(pb.PublishRequest(queue="q"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "GROUP_UNAVAILABLE" in str(refused.value.trailing_metadata())


async def test_a_streamed_request_that_arrives_with_its_call_is_not_dropped() -> None:
    """The call and its first messages often come in one read of the socket: they must reach
    the handler (they were once dropped before the call's task ran)."""
    async with Relay() as relay:
        link = relay.link
        call_id, state = link.open(
            fr.Call(f"/{SERVICE}/PublishStream", None, fr.Shape.STREAM_STREAM, (), b"")
        )
        for i in range(3):  # no await that yields: all of it goes before the shard side reads
            assert await link.send_request(
                call_id, state, pb.PublishStreamRequest(sequence=i).SerializeToString()
            )
        link.half_close(call_id)
        got: list[int] = []

        async def answers() -> None:
            while (item := await link.next_item(call_id, state)) is not _END:
                got.append(pb.PublishStreamResponse.FromString(item).sequence)

        await asyncio.wait_for(answers(), 10)
        assert got == [0, 1, 2]


def assert_node_busy(tasks: list[asyncio.Future[Any]]) -> None:
    for task in tasks:
        err = task.exception()
        assert isinstance(err, grpc.aio.AioRpcError)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "NODE_BUSY" in str(err.trailing_metadata())


async def test_calls_the_shard_process_does_not_read_are_bounded_then_refused_as_node_busy() -> (
    None
):
    async with Relay() as relay:
        assert relay.shard._channel is not None and relay.shard._channel._transport is not None
        relay.shard._channel._transport.pause_reading()  # the shard process stops reading
        publish = relay.method("Publish", pb.PublishRequest, pb.PublishResponse, "unary_unary")
        body = [pb.PublishMessage(value=b"x" * 300_000)]
        calls = [publish(pb.PublishRequest(queue="q", messages=body)) for _ in range(40)]
        done, pending = await asyncio.wait([asyncio.ensure_future(c) for c in calls], timeout=3)
        busy = [t for t in done if t.exception() is not None]
        assert busy, "calls beyond the bound are refused, not buffered without end"
        assert_node_busy(busy)
        assert relay.link._channel is not None
        assert relay.link._channel.buffered_bytes <= BUFFERED_BYTES_MAX + 400_000
        relay.shard._channel._transport.resume_reading()
        waited = await asyncio.gather(*pending)  # what was taken is answered once read
        assert all(len(r.results) == 1 for r in waited)


async def test_one_keys_flood_is_refused_node_busy_while_another_keys_small_call_is_relayed() -> (
    None
):
    async with Relay() as relay:
        assert relay.shard._channel is not None and relay.shard._channel._transport is not None
        relay.shard._channel._transport.pause_reading()  # the shard process falls behind
        publish = relay.method("Publish", pb.PublishRequest, pb.PublishResponse, "unary_unary")
        fat = (("authorization", "Bearer fmq_test_sk_" + "a" * 32),)
        small = (("authorization", "Bearer fmq_test_sk_" + "b" * 32),)
        body = [pb.PublishMessage(value=b"x" * 300_000)]
        flood = [
            asyncio.ensure_future(
                publish(pb.PublishRequest(queue="q", messages=body), metadata=fat, timeout=10)
            )
            for _ in range(8)
        ]
        await asyncio.wait(flood, timeout=1)
        refused = [t for t in flood if t.done() and t.exception() is not None]
        assert len(refused) >= 6, "a key holds at most half of the link's bytes"
        assert_node_busy(refused)
        other = asyncio.ensure_future(
            publish(
                pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"y")]),
                metadata=small,
                timeout=10,
            )
        )
        await asyncio.sleep(0.2)
        assert not other.done(), "the other key's call is sent, not refused"
        relay.shard._channel._transport.resume_reading()
        assert len((await other).results) == 1
        await asyncio.gather(*flood, return_exceptions=True)
        assert relay.link._budget.in_use == 0  # every answered or refused call gave its bytes back


async def test_calls_in_flight_end_when_the_shard_process_closes_its_end() -> None:
    async with Relay() as relay:
        tail = relay.method("Tail", pb.TailRequest, pb.TailResponse, "unary_stream")
        call = tail(pb.TailRequest(queue="q", max_messages=100))
        for _ in range(6):
            await call.read()
        assert relay.shard._channel is not None
        relay.shard._channel.close()  # the process lives on (stopping), its end is closed
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "OUTCOME_UNKNOWN" in str(err.value.trailing_metadata())
        assert not relay.link.attached


async def test_a_call_frame_that_does_not_decode_closes_the_channel() -> None:
    async with Relay() as relay:
        front_end, shard = relay.link._channel, relay.shard._channel
        assert front_end is not None and shard is not None
        front_end.send(fr.frame(fr.Kind.CALL, 7, fr._U16.pack(400) + b"/x"))  # cut short
        await asyncio.wait_for(shard.closed.wait(), 5)  # closed, not an exception in a callback
        await asyncio.wait_for(front_end.closed.wait(), 5)
        assert not relay.link.attached
