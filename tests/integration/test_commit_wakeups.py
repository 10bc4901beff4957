"""The apply side hands the event loop a commit's wake-ups only when some call waits: most
rounds (every round on a follower nobody reads from) cost the loop nothing, and a long poll
still wakes at the append that ends its wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.app import build_server
from fluxmq.server.router import Router
from fluxmq.server.shard.runtime import ShardRuntime
from raft import LocalShard
from storage import MemoryStore


class CountingShard(LocalShard):
    def __init__(self, state: QueueStateMachine) -> None:
        super().__init__(state)
        self.posted: list[str] = []

    def post_to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        self.posted.append(getattr(fn, "__name__", repr(fn)))
        super().post_to_loop(fn, *args)


@pytest.fixture
async def served() -> AsyncIterator[
    tuple[ShardRuntime, CountingShard, queue_pb2_grpc.QueueServiceStub]
]:
    state = QueueStateMachine(MemoryStore())
    shard = CountingShard(state)
    runtime = ShardRuntime(state, shard)
    await runtime.start()
    server, _health, port = build_server(
        Router.of_one(runtime), "127.0.0.1:0", request_bytes_max=1 << 20
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield runtime, shard, queue_pb2_grpc.QueueServiceStub(ch)
    finally:
        await server.stop(None)
        await runtime.close()


async def test_commits_nobody_waits_for_post_nothing_to_the_loop_and_a_waiter_still_wakes(
    served: tuple[ShardRuntime, CountingShard, queue_pb2_grpc.QueueServiceStub],
) -> None:
    runtime, shard, stub = served
    await stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="q")))
    for k in range(10):
        await stub.Publish(
            pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"m%d" % k)])
        )
    assert shard.posted == []
    poll = asyncio.ensure_future(
        stub.Fetch(
            pb.FetchRequest(queue="q", partition=0, offset=10, max_messages=10, wait_ms=10_000)
        )
    )
    for _ in range(500):  # until the long poll waits (bounded)
        if runtime.wakeups.waiting:
            break
        await asyncio.sleep(0.01)
    assert runtime.wakeups.waiting and not poll.done()
    await stub.Publish(pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"late")]))
    fetched = await asyncio.wait_for(poll, 5)
    assert [r.value for r in fetched.records] == [b"late"]
    assert shard.posted == ["committed"]
