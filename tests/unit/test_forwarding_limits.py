"""Limits are the same whatever node a client talks to (issue 20, item 12): a call forwarded to
the node serving the queue passes exactly when a direct call would (answers up to the server's
64 MiB, not gRPC's default 4 MiB receive limit), and a message refused over a size limit between
nodes is not retriable and names the limit (a retry could never succeed). Relayed streams hold
one of the relaying node's stream slots (item 7). In-process gRPC servers on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core.errors import FluxError
from fluxmq.server.errors import status_code
from fluxmq.server.forwarding import RESPONSE_BYTES_MAX, Forwarder
from fluxmq.server.stream_slots import StreamSlots

FETCH_BYTES = 5_400_000  # the 5.4 MB Fetch of the report: over gRPC's default 4 MiB
REQUEST_BYTES_MAX = 1024 * 1024


class ServingNode(queue_pb2_grpc.QueueServiceServicer):
    """What the node hosting the queue answers."""

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        resp = pb.FetchResponse(next_offset=1, high_watermark=1)
        resp.records.add(partition=0, offset=0, value=b"x" * FETCH_BYTES)
        return resp

    async def Publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        return pb.PublishResponse()

    async def Tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.TailResponse]:
        while True:
            yield pb.TailResponse(records=[pb.Record(value=b"t")])
            await asyncio.sleep(0.05)


class CallerContext:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


@pytest.fixture
async def serving_node() -> AsyncIterator[str]:
    server = grpc.aio.server(
        options=[
            # As fluxmq.server.app.build_server sets them.
            ("grpc.max_receive_message_length", REQUEST_BYTES_MAX),
            ("grpc.max_send_message_length", RESPONSE_BYTES_MAX),
        ]
    )
    queue_pb2_grpc.add_QueueServiceServicer_to_server(ServingNode(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_fetch_answer_over_4_mib_passes_through_a_forwarding_node(
    serving_node: str,
) -> None:
    forwarder = Forwarder()
    try:
        request = pb.FetchRequest(queue="big", partition=0, max_bytes=16 * 1024 * 1024)
        resp = await forwarder.forward(serving_node, "Fetch", request, CallerContext())
        assert len(resp.records[0].value) == FETCH_BYTES
    finally:
        await forwarder.close()


async def test_a_message_over_a_size_limit_between_nodes_is_not_retriable_and_names_it(
    serving_node: str,
) -> None:
    forwarder = Forwarder()
    try:
        request = pb.PublishRequest(
            queue="big", messages=[pb.PublishMessage(value=b"x" * (2 * REQUEST_BYTES_MAX))]
        )
        with pytest.raises(FluxError) as exc:
            await forwarder.forward(serving_node, "Publish", request, CallerContext())
        err = exc.value
        assert err.reason == "SIZE_LIMIT_EXCEEDED"
        assert not err.retriable and err.retry_after_ms is None
        assert status_code(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "request_bytes_max" in err.message and "retry" not in err.message
    finally:
        await forwarder.close()


async def test_a_forwarder_sends_no_more_than_its_node_accepts(serving_node: str) -> None:
    forwarder = Forwarder(request_bytes_max=REQUEST_BYTES_MAX)
    try:
        request = pb.PublishRequest(
            queue="big", messages=[pb.PublishMessage(value=b"x" * (2 * REQUEST_BYTES_MAX))]
        )
        with pytest.raises(FluxError) as exc:
            await forwarder.forward(serving_node, "Publish", request, CallerContext())
        assert exc.value.reason == "SIZE_LIMIT_EXCEEDED" and not exc.value.retriable
    finally:
        await forwarder.close()


async def test_a_relayed_stream_holds_a_stream_slot_of_the_relaying_node(
    serving_node: str,
) -> None:
    forwarder = Forwarder(streams=StreamSlots(1))
    try:
        first = forwarder.forward_stream(serving_node, "Tail", pb.TailRequest(), CallerContext())
        assert (await anext(first)).records[0].value == b"t"
        second = forwarder.forward_stream(serving_node, "Tail", pb.TailRequest(), CallerContext())
        with pytest.raises(FluxError) as exc:
            await anext(second)
        assert exc.value.reason == "TOO_MANY_STREAMS" and exc.value.retriable
        assert status_code(exc.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
        await first.aclose()
        third = forwarder.forward_stream(serving_node, "Tail", pb.TailRequest(), CallerContext())
        assert (await anext(third)).records[0].value == b"t"
        await third.aclose()
        assert forwarder.streams.open == 0
    finally:
        await forwarder.close()
