"""Concurrent ``publish()`` calls against a real broker: they share Publish requests
(fluxmq/client/pipeline.py), and each caller still gets its own position or its own error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fluxmq.client import AsyncClient, InvalidArgument
from fluxmq.client import pipeline as pipeline_module
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow

CALLERS = 50


def count_publish_requests(client: AsyncClient, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """-> a list that gets the message count of every Publish request the client sends."""
    sizes: list[int] = []
    real_unary = client.transport.unary

    async def unary(service: str, method: str, request: Any, **kw: Any) -> Any:
        if method == "Publish":
            sizes.append(len(request.messages) + request.encoded.count)
        return await real_unary(service, method, request, **kw)

    monkeypatch.setattr(client.transport, "unary", unary)
    return sizes


async def test_concurrent_publishes_share_requests_and_each_caller_gets_its_own_offset(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("coalesced", type="work", partitions=1)
        values = [f"v{i}" for i in range(CALLERS)]
        results = await asyncio.gather(*(client.publish("coalesced", v) for v in values))
        assert sorted(r.offset for r in results) == list(range(CALLERS))
        requests = client._pipelines["coalesced"].requests_sent
        assert requests < CALLERS / 2, requests
        fetched = await client.fetch("coalesced", 0, 0, max_messages=CALLERS)
        by_offset = {r.offset: r.value.decode() for r in fetched.records}
        # Each caller's result names the offset where its own value is stored.
        assert [by_offset[r.offset] for r in results] == values


async def test_a_message_the_broker_refuses_fails_only_its_own_publish(broker: Node) -> None:
    week_and_a_day_ms = 8 * 24 * 3600 * 1000
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("one-bad", type="work", partitions=1)
        await client.publish("one-bad", "ok-first")  # the next requests take the stream
        calls = [client.publish("one-bad", f"ok{i}") for i in range(10)]
        calls.insert(3, client.publish("one-bad", "late", delay_ms=week_and_a_day_ms))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        refused = outcomes.pop(3)
        assert isinstance(refused, InvalidArgument), refused
        assert refused.field_violations, "the refusal names the offending field"
        assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
        assert client._pipelines["one-bad"].requests_split >= 1
        assert client._pipelines["one-bad"].requests_streamed >= 1
        fetched = await client.fetch("one-bad", 0, 0, max_messages=100)
        assert sorted(r.value.decode() for r in fetched.records) == sorted(
            ["ok-first"] + [f"ok{i}" for i in range(10)]
        )


async def test_one_caller_publishing_in_turn_keeps_its_order(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("in-turn", type="work", partitions=1)
        offsets = [(await client.publish("in-turn", f"n{i}")).offset for i in range(20)]
        assert offsets == list(range(20))


async def test_publish_requests_travel_on_one_stream_not_one_call_each(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("streamed", type="work", partitions=1)
        unary_sizes = count_publish_requests(client, monkeypatch)
        for i in range(3):
            await client.publish("streamed", f"first{i}")
        results = await asyncio.gather(
            *(client.publish("streamed", f"s{i}") for i in range(CALLERS))
        )
        pipeline = client._pipelines["streamed"]
        # The first asks for the leader (unary); every later request takes the stream.
        assert unary_sizes == [1]
        assert pipeline.requests_streamed == pipeline.requests_sent - 1 >= 3
        assert sorted(r.offset for r in results) == list(range(3, CALLERS + 3))


class LosingStream:
    """A real PublishStream whose answers never reach the client, until it is cancelled (as a
    connection that died after the node got the requests)."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def write(self, request: Any) -> None:
        await self._call.write(request)

    def cancel(self) -> None:
        self._call.cancel()

    def __aiter__(self) -> Any:
        return self._lose()

    async def _lose(self) -> Any:
        async for _answer in self._call:
            pass  # lost on the way
        if False:  # an async generator that yields nothing
            yield None


async def test_requests_a_broken_stream_did_not_answer_are_stored_once(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream breaks with requests the node got and stored but whose answers were lost:
    their outcome is unknown to the client, so they are sent again on the unary path, and the
    idempotency keys keep each message stored once (the resent ones answer ``duplicate``)."""
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("broken", type="work", partitions=1)
        real_stream = client.transport.publish_stream
        lanes: list[Any] = []

        def publish_stream(address: str) -> Any:
            call = LosingStream(real_stream(address)) if not lanes else real_stream(address)
            lanes.append(call)
            return call

        monkeypatch.setattr(client.transport, "publish_stream", publish_stream)
        await client.publish("broken", "first")  # unary: asks for the leader
        values = [f"b{i}" for i in range(CALLERS)]
        calls = asyncio.gather(*(client.publish("broken", v) for v in values))
        await asyncio.sleep(0.5)  # the node stores what was written; no answer comes back
        lanes[0].cancel()
        results = await calls
        assert any(r.duplicate for r in results), "no request was sent again"
        fetched = await client.fetch("broken", 0, 0, max_messages=CALLERS * 2)
        assert sorted(r.value.decode() for r in fetched.records) == sorted(["first", *values])
        by_offset = {r.offset: r.value.decode() for r in fetched.records}
        assert [by_offset[r.offset] for r in results] == values


async def test_an_idle_stream_gives_its_slot_back_and_the_next_publish_opens_another(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_module, "LANE_IDLE_S", 0.2)
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("idle", type="work", partitions=1)
        await client.publish("idle", "first")
        await client.publish("idle", "on the stream")
        pipeline = client._pipelines["idle"]
        (first_lane,) = client._lanes._lanes.values()
        assert pipeline.requests_streamed == 1
        await asyncio.sleep(0.6)
        assert not client._lanes._lanes and first_lane.broken is not None
        r = await client.publish("idle", "after")
        assert r.offset == 2 and pipeline.requests_streamed == 2
        (second_lane,) = client._lanes._lanes.values()
        assert second_lane is not first_lane
