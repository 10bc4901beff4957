"""Review of the publish pipeline against a real node: the PublishStreams it opens share the
node's stream slots (fluxmq/server/stream_slots.py) with every Tail and Consume."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client import AsyncClient, InvalidArgument
from tests.integration import test_stream_limits as limits
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow

small_node = limits.small_node  # a node with STREAMS_MAX stream slots (a fixture)
STREAMS_MAX = limits.STREAMS_MAX


async def test_publishing_to_many_queues_leaves_stream_slots_for_consumers(
    small_node: Node,
) -> None:
    async with (
        AsyncClient(small_node.address) as publisher,
        AsyncClient(small_node.address) as reader,
    ):
        queues = [f"q{i}" for i in range(STREAMS_MAX)]
        for q in queues:
            await publisher.admin.create_queue(q, type="stream", partitions=1)
        for q in queues:
            for i in range(2):  # the second publish of a queue goes on its stream
                await publisher.publish(q, f"v{i}")
        streamed = sum(p.requests_streamed for p in publisher._pipelines.values())
        assert streamed == STREAMS_MAX  # one PublishStream held open per queue
        # Another application's Tail on the same node, right after.
        stub = reader.transport._node(small_node.address).queue
        call = stub.Tail(pb.TailRequest(queue="q0", start=pb.StartPosition(earliest=True)))
        try:
            async with asyncio.timeout(3.0):
                first = await call.read()
        finally:
            call.cancel()
        assert isinstance(first, pb.TailResponse), first
        assert [r.value for r in first.records][:1], first


async def test_an_idle_publish_stream_does_not_hold_a_node_shutdown(node: Node) -> None:
    """SIGTERM drains the node: streams that wait (Tail, Consume) end at once; a client's
    PublishStream with nothing in flight must not keep the node up for its whole grace period."""
    async with AsyncClient(node.address, timeout_s=2.0) as client:
        await client.admin.create_queue("restarted", type="work", partitions=1)
        await client.publish("restarted", "a")
        await client.publish("restarted", "b")  # on the stream, which then stays open
        assert client._pipelines["restarted"].requests_streamed == 1
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(node.proc.wait, 3.0)
        except subprocess.TimeoutExpired:
            pytest.fail("the node still runs 3 s after SIGTERM (without the stream: 0.2 s)")


async def test_a_refused_publish_names_the_same_field_on_the_stream_as_unary(
    broker: Node,
) -> None:
    """The first publish of a queue goes unary, the next on its PublishStream: the same bad
    call must name the same offending field either way."""
    week_and_a_day_ms = 8 * 24 * 3600 * 1000
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("same-field", type="work", partitions=1)
        await client.publish("same-field", "ok")  # unary: the next requests take the stream
        fields = []
        for _ in range(2):
            with pytest.raises(InvalidArgument) as refused:
                await client.publish("same-field", "late", delay_ms=week_and_a_day_ms)
            fields.append([v.field for v in refused.value.field_violations])
        (lane,) = client._lanes._lanes.values()
        assert lane.answered >= 1  # the refusals came on the stream
        assert fields == [["messages[0].delay_ms"]] * 2, fields
