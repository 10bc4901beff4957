"""A node that only relays a call (it does not host the queue's group) ends the relayed calls
that wait for messages within a moment of its SIGTERM, as the calls it serves itself:
long polls (Lease, Fetch with wait_ms) and streams (Consume, Tail) end with NODE_SHUTTING_DOWN
and the call to the other node is cancelled. When the *answering* node is the one shutting
down, the relay does not pass its NODE_SHUTTING_DOWN on (a client would then skip the healthy
relay): a long poll goes once to another node of the group, anything else ends with a
retriable GROUP_UNAVAILABLE naming the node that stops. A relayed long poll may take its
``wait_ms``, not only the forwarding timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import FluxError
from fluxmq.server.errors import node_shutting_down, to_rpc_status
from fluxmq.server.forwarding import FORWARD_TIMEOUT_S, Forwarder, remote_error
from fluxmq.server.router import Router, RoutingInterceptor

RELAYED_TO = "10.0.0.3:7070"
OTHER = "10.0.0.1:7070"
ENDS_WITHIN_S = 1.0


class FakeShard:
    shard_id = "g1"

    def __init__(self) -> None:
        self.drained = False

    def drain(self) -> None:
        self.drained = True


class HangingForwarder:
    """Every forwarded call waits until cancelled (a long poll with nothing to deliver), or
    answers with the next scripted outcome; streams yield one item, then wait."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.called: list[str] = []
        self.cancelled = 0

    async def forward(self, address: str, method: str, request: Any, context: Any) -> Any:
        self.called.append(address)
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, FluxError):
                raise outcome
            return outcome
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def forward_stream(
        self, address: str, method: str, request: Any, context: Any
    ) -> AsyncGenerator[Any, None]:
        self.called.append(address)
        try:
            yield "first"
            await asyncio.sleep(3600)
        finally:
            self.cancelled += 1

    async def close(self) -> None:
        pass


def relay(forwarder: HangingForwarder, view: Any = None) -> tuple[Router, RoutingInterceptor]:
    router = Router("g1", forwarder)  # type: ignore[arg-type]
    router.view = view
    router.add_shard(FakeShard())  # type: ignore[arg-type]
    return router, RoutingInterceptor(router)


async def ends_with_node_shutting_down(task: asyncio.Task[Any]) -> None:
    async with asyncio.timeout(ENDS_WITHIN_S):
        with pytest.raises(FluxError) as err:
            await task
    assert err.value.reason == "NODE_SHUTTING_DOWN"
    assert err.value.retriable


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Lease", pb.LeaseRequest(queue="q", group="g", consumer_id="c", wait_ms=30_000)),
        ("Fetch", pb.FetchRequest(queue="q", partition=0, wait_ms=30_000)),
    ],
)
async def test_relayed_long_poll_ends_with_node_shutting_down_when_the_relay_drains(
    method: str, request_: Any
) -> None:
    fwd = HangingForwarder()
    router, icpt = relay(fwd)
    task = asyncio.create_task(icpt._forward(RELAYED_TO, method, request_, None))
    await asyncio.sleep(0.05)
    assert not task.done()
    router.drain()
    await ends_with_node_shutting_down(task)
    assert fwd.cancelled == 1  # the call to the other node does not go on
    assert router.home.drained  # type: ignore[attr-defined]
    # A new relayed long poll is refused at once, without bothering the other node.
    with pytest.raises(FluxError) as err:
        await icpt._forward(RELAYED_TO, method, request_, None)
    assert err.value.reason == "NODE_SHUTTING_DOWN"
    assert fwd.called == [RELAYED_TO]


async def test_relayed_writes_go_on_while_the_relay_drains() -> None:
    fwd = HangingForwarder(pb.PublishResponse())
    router, icpt = relay(fwd)
    router.drain()
    got = await icpt._forward(RELAYED_TO, "Publish", pb.PublishRequest(queue="q"), None)
    assert isinstance(got, pb.PublishResponse)


async def test_relayed_stream_ends_with_node_shutting_down_when_the_relay_drains() -> None:
    fwd = HangingForwarder()
    router, icpt = relay(fwd)
    stream = icpt._relay_stream(RELAYED_TO, "Consume", pb.ConsumeRequest(queue="q"), None)
    assert await anext(stream) == "first"
    task: asyncio.Task[Any] = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    router.drain()
    await ends_with_node_shutting_down(task)
    assert fwd.cancelled == 1  # the relayed stream was closed


def view_of_group(relay_node: str = "node4") -> Any:
    """A directory: queue q on group ga (node1..node3, led by node3); this node is node4."""
    addresses = {"node1": OTHER, "node2": "10.0.0.2:7070", "node3": RELAYED_TO}

    async def shard_of(queue: str) -> str:
        return "ga"

    return SimpleNamespace(
        shard_of=shard_of,
        shard_records={"ga": SimpleNamespace(members=("node1", "node2", "node3"))},
        leaders={"ga": ("node3", 4)},
        nodes={n: SimpleNamespace(grpc_address=a) for n, a in addresses.items()},
        node=SimpleNamespace(node_id=relay_node),
    )


def answered(err: FluxError) -> grpc.aio.AioRpcError:
    """The AioRpcError a relay's client call raises when the other node answered ``err``."""
    status = to_rpc_status(err, "rid")
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailing, status.message
    )


def test_remote_node_shutting_down_is_not_passed_on_as_the_relays_own() -> None:
    err = remote_error(answered(node_shutting_down()), RELAYED_TO)
    assert err.reason == "GROUP_UNAVAILABLE"  # UNAVAILABLE, retriable, and not about the relay
    assert err.retriable
    assert err.metadata["node"] == RELAYED_TO
    assert RELAYED_TO in err.message


async def test_relayed_long_poll_goes_to_another_replica_when_its_node_shuts_down() -> None:
    stops = remote_error(answered(node_shutting_down()), RELAYED_TO)
    fwd = HangingForwarder(stops, pb.LeaseResponse())
    _, icpt = relay(fwd, view_of_group())
    lease = pb.LeaseRequest(queue="q", group="g", consumer_id="c", wait_ms=30_000)
    got = await icpt._forward(RELAYED_TO, "Lease", lease, None)
    assert isinstance(got, pb.LeaseResponse)
    assert fwd.called == [RELAYED_TO, OTHER]  # not the node that stops


async def test_relayed_call_without_another_replica_ends_retriable_not_shutting_down() -> None:
    stops = remote_error(answered(node_shutting_down()), RELAYED_TO)
    fwd = HangingForwarder(stops)
    _, icpt = relay(fwd, None)  # no directory: nowhere else to go
    lease = pb.LeaseRequest(queue="q", group="g", consumer_id="c", wait_ms=30_000)
    with pytest.raises(FluxError) as err:
        await icpt._forward(RELAYED_TO, "Lease", lease, None)
    assert err.value.reason == "GROUP_UNAVAILABLE"
    assert err.value.retriable


class RecordingStub:
    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def __getattr__(self, method: str) -> Any:
        async def call(request: Any, **options: Any) -> Any:
            self.timeouts.append(options["timeout"])
            return pb.LeaseResponse()

        return call


class Ctx:
    def invocation_metadata(self) -> tuple[()]:
        return ()


async def test_relayed_long_poll_may_wait_its_wait_ms_not_only_the_forward_timeout() -> None:
    forwarder = Forwarder()
    stub = RecordingStub()
    forwarder.queue_service = lambda address: stub  # type: ignore[assignment,method-assign,return-value]
    lease = pb.LeaseRequest(queue="q", group="g", consumer_id="c", wait_ms=30_000)
    await forwarder.forward(RELAYED_TO, "Lease", lease, Ctx())
    await forwarder.forward(RELAYED_TO, "GetQueue", pb.GetQueueRequest(name="q"), Ctx())
    assert stub.timeouts == [FORWARD_TIMEOUT_S + 30.0, FORWARD_TIMEOUT_S]
