"""The SDK's transport on NODE_SHUTTING_DOWN: the call goes to another node, and the stopping
node is not used again meanwhile, even when answers still name it as the queue's leader (it
leads until its hand-over completes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.client import RetryPolicy
from fluxmq.client._transport import LEADER_KEY, Transport
from fluxmq.server.errors import node_shutting_down, to_grpc_status


class FakeNode(queue_pb2_grpc.QueueServiceServicer):
    """Answers Lease with no messages and a leader trailer, or, shutting down, with the
    broker's NODE_SHUTTING_DOWN status."""

    def __init__(self, shutting_down: bool) -> None:
        self.shutting_down = shutting_down
        self.leader = ""
        self.leases = 0
        self.address = ""

    async def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:
        self.leases += 1
        if self.shutting_down:
            await context.abort_with_status(to_grpc_status(node_shutting_down(), "rid"))
        context.set_trailing_metadata(((LEADER_KEY, self.leader),))
        return pb.LeaseResponse()


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FakeNode, FakeNode]]:
    fakes = (FakeNode(shutting_down=True), FakeNode(shutting_down=False))
    servers = []
    for fake in fakes:
        server = grpc.aio.server()
        queue_pb2_grpc.add_QueueServiceServicer_to_server(fake, server)  # type: ignore[no-untyped-call]
        fake.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        servers.append(server)
    for fake in fakes:
        fake.leader = fakes[0].address  # the stopping node still leads: hand-over under way
    try:
        yield fakes
    finally:
        for server in servers:
            await server.stop(None)


async def test_node_shutting_down_is_left_and_not_taken_back_as_the_leader(
    nodes: tuple[FakeNode, FakeNode],
) -> None:
    stopping, other = nodes
    transport = Transport(
        [stopping.address, other.address], timeout_s=5, retry=RetryPolicy(max_attempts=3)
    )
    try:
        request = pb.LeaseRequest(queue="q", group="g", consumer_id="c", wait_ms=30_000)
        for _ in range(3):
            await transport.unary("queue", "Lease", request, safe=True, queue="q")
        assert (stopping.leases, other.leases) == (1, 3)
        assert transport.current == other.address
        assert transport.leader_of("q") is None  # named by the answers, but stopping
        assert transport.retries == 1
    finally:
        await transport.close()
