"""The SDK follows a NOT_LEADER redirect: the ErrorInfo ``leader`` of a refusal names the gRPC
address of the shard's leader, and the next attempt goes there at once (and later calls of the
queue too), instead of repeating the call on the node that cannot answer it. Two fake brokers
in this process: a follower that refuses every call, and the leader it names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import queue_pb2, queue_pb2_grpc
from fluxmq.client import AsyncClient, FluxMQError, RetryPolicy
from tests.client.test_auth_options import _Status

# Few attempts, short backoffs: the old behaviour (retrying the follower) fails fast.
POLICY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def not_leader(context: grpc.ServicerContext, leader: str) -> None:
    """Ends the call as a follower does: UNAVAILABLE, ErrorInfo NOT_LEADER naming ``leader``."""
    info = error_details_pb2.ErrorInfo(
        reason="NOT_LEADER",
        domain="fluxmq",
        metadata={"leader": leader, "retriable": "true", "request_id": "req1"},
    )
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(200)
    details = []
    for detail in (info, error_details_pb2.RetryInfo(retry_delay=delay)):
        packed = any_pb2.Any()
        packed.Pack(detail)
        details.append(packed)
    status = rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.UNAVAILABLE.value[0],
            message="this node does not lead the queue's replication group",
            details=details,
        )
    )
    context.abort_with_status(_Status(status.code, status.details, status.trailing_metadata))


@dataclass
class Node(queue_pb2_grpc.QueueServiceServicer):
    """Answers Publish and Heartbeat when ``redirect_to`` is None, else refuses with
    NOT_LEADER naming ``redirect_to``. Counts the calls it received."""

    redirect_to: str | None = None
    calls: list[str] = field(default_factory=list)
    address: str = ""

    def Publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append("Publish")
        if self.redirect_to is not None:
            not_leader(context, self.redirect_to)
        context.set_trailing_metadata((("x-fluxmq-leader", self.address),))
        return queue_pb2.PublishResponse(
            results=[queue_pb2.PublishResult(partition=0, offset=len(self.calls))]
        )


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    """(follower, leader): the follower redirects to the leader."""
    servers = []
    made = []
    for _ in range(2):
        node = Node()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        queue_pb2_grpc.add_QueueServiceServicer_to_server(node, server)  # type: ignore[no-untyped-call]
        node.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        made.append(node)
    follower, leader = made
    follower.redirect_to = leader.address
    try:
        yield follower, leader
    finally:
        for server in servers:
            server.stop(grace=None).wait(5)


async def test_not_leader_redirect_goes_to_the_named_leader(nodes: tuple[Node, Node]) -> None:
    follower, leader = nodes
    async with AsyncClient(follower.address, retry=POLICY, timeout_s=5) as client:
        started = time.monotonic()
        first = await client.publish("orders", b"one")
        # Straight to the leader: no RetryInfo wait (200 ms) for a call another node can take.
        assert time.monotonic() - started < 0.2
        assert first.offset == 1
        assert follower.calls == ["Publish"] and leader.calls == ["Publish"]
        assert client.transport.leader_of("orders") == leader.address
        assert leader.address in client.addresses
        await client.publish("orders", b"two")  # the queue's calls now go to the leader
        assert follower.calls == ["Publish"] and leader.calls == ["Publish", "Publish"]


async def test_not_leader_naming_no_leader_retries_after_the_advised_delay(
    nodes: tuple[Node, Node],
) -> None:
    follower, _ = nodes
    follower.redirect_to = ""  # an election is on: nobody to go to
    async with AsyncClient(follower.address, retry=POLICY, timeout_s=5) as client:
        started = time.monotonic()
        with pytest.raises(FluxMQError) as err:
            await client.publish("orders", b"one")
        assert err.value.reason == "NOT_LEADER"
        assert follower.calls == ["Publish"] * POLICY.max_attempts
        assert time.monotonic() - started >= 0.4  # two RetryInfo waits of 200 ms
        assert client.transport.leader_of("orders") is None
