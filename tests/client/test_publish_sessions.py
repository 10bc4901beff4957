"""``AsyncClient.publish()`` in a producer session against a real node: the SDK picks the
partition as the broker would, a resend after a lost answer is stored once, and a refused
request does not block its partition (fluxmq/client/sessions.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from fluxmq.client import AsyncClient, InvalidArgument
from fluxmq.client.partitioning import key_partition
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow


async def test_publish_travels_in_a_session_and_stores_no_idempotency_keys(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-plain", type="stream", partitions=1)
        results = await asyncio.gather(*(client.publish("sess-plain", f"v{i}") for i in range(20)))
        assert sorted(r.offset for r in results) == list(range(20))
        assert not any(r.duplicate for r in results)
        fetched = await client.fetch("sess-plain", 0, 0)
        assert len(fetched.records) == 20
        assert all(not r.idempotency_key for r in fetched.records)
        assert client._pipelines["sess-plain"].session.renewals == 0


async def test_keyed_messages_land_in_the_partition_the_shared_hash_names(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-keys", type="stream", partitions=7)
        keys = [f"user-{i}".encode() for i in range(40)]
        results = await asyncio.gather(*(client.publish("sess-keys", b"v", key=k) for k in keys))
        assert [r.partition for r in results] == [key_partition(k, 7) for k in keys]
        for k, r in zip(keys, results, strict=True):
            fetched = await client.fetch("sess-keys", r.partition, r.offset, max_messages=1)
            assert fetched.records[0].key == k


async def test_keyless_messages_fill_requests_of_one_partition(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-sticky", type="stream", partitions=4)
        results = await asyncio.gather(*(client.publish("sess-sticky", b"v") for _ in range(30)))
        pipeline = client._pipelines["sess-sticky"]
        # Callers that arrive together share requests (a request is one partition's), and
        # the sticky partition moves on after each request.
        assert pipeline.requests_sent < 30
        by_partition: dict[int, list[int]] = {}
        for r in results:
            by_partition.setdefault(r.partition, []).append(r.offset)
        assert len(by_partition) == min(4, pipeline.requests_sent)
        for offsets in by_partition.values():
            assert sorted(offsets) == list(range(len(offsets)))


class AnswerLost:
    """A PublishStream whose node takes every request but whose answers never arrive: the
    stream breaks after the write, as a connection lost mid-request does."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._written = asyncio.Event()

    def __aiter__(self) -> AnswerLost:
        return self

    async def __anext__(self) -> Any:
        await self._written.wait()
        await asyncio.sleep(0.3)  # the node stored the request meanwhile
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "lost"
        )

    async def write(self, request: Any) -> None:
        await self._call.write(request)
        self._written.set()

    def cancel(self) -> None:
        self._call.cancel()


async def test_a_resend_after_a_lost_answer_is_stored_once_with_the_first_offset(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-lost", type="stream", partitions=1)
        await client.publish("sess-lost", "first")  # unary: the next one takes the stream
        real = client.transport.publish_stream
        monkeypatch.setattr(
            client.transport, "publish_stream", lambda address: AnswerLost(real(address))
        )
        result = await client.publish("sess-lost", "second")
        assert result.offset == 1 and result.duplicate  # the resend found the first write
        fetched = await client.fetch("sess-lost", 0, 0)
        assert [r.value for r in fetched.records] == [b"first", b"second"]


async def test_a_refused_request_does_not_block_later_publishes_of_its_partition(
    broker: Node,
) -> None:
    week_and_a_day_ms = 8 * 24 * 3600 * 1000
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-refused", type="stream", partitions=1)
        await client.publish("sess-refused", "before")
        calls = [client.publish("sess-refused", f"ok{i}") for i in range(8)]
        calls.insert(2, client.publish("sess-refused", "late", delay_ms=week_and_a_day_ms))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(outcomes.pop(2), InvalidArgument)
        assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
        after = await client.publish("sess-refused", "after")
        fetched = await client.fetch("sess-refused", 0, 0)
        values = [r.value.decode() for r in fetched.records]
        assert sorted(values) == sorted(["before", "after", *(f"ok{i}" for i in range(8))])
        assert values[-1] == "after" and after.offset == len(values) - 1
        assert client._pipelines["sess-refused"].session.renewals >= 1


async def test_one_caller_keeps_its_order_in_a_partition(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-order", type="stream", partitions=3)
        for i in range(30):
            await client.publish("sess-order", f"{i}", key=b"same-key")
        p = key_partition(b"same-key", 3)
        fetched = await client.fetch("sess-order", p, 0)
        assert [int(r.value) for r in fetched.records] == list(range(30))


async def test_publish_batch_travels_in_the_session_in_order(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-batch", type="stream", partitions=1)
        values = [f"b{i}" for i in range(2500)]
        results = await client.publish_batch("sess-batch", values)
        assert [r.offset for r in results] == list(range(2500))
        fetched: list[Any] = []
        offset = 0
        while offset < 2500:
            resp = await client.fetch("sess-batch", 0, offset, max_messages=1000)
            fetched.extend(resp.records)
            offset = resp.next_offset
        assert [r.value.decode() for r in fetched] == values
        assert all(not r.idempotency_key for r in fetched)
        pipeline = client._pipelines["sess-batch"]
        assert pipeline.requests_sent <= 6  # requests of up to 1000 messages


async def test_buffered_producer_travels_in_a_session_and_keeps_order_with_requests_in_flight(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-producer", type="stream", partitions=1)
        async with client.producer(
            "sess-producer", max_messages=50, linger_ms=1, max_in_flight=4
        ) as producer:
            futs = [await producer.send(f"p{i}") for i in range(600)]
        results = [f.result() for f in futs]
        assert [r.offset for r in results] == list(range(600))
        assert producer.sent_requests >= 12
        fetched = await client.fetch("sess-producer", 0, 0, max_messages=1000)
        assert [r.value.decode() for r in fetched.records] == [f"p{i}" for i in range(600)]
        assert all(not r.idempotency_key for r in fetched.records)


async def test_publish_batch_of_values_travels_encoded_and_each_thousand_takes_the_next_partition(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("sess-spread", type="stream", partitions=3)
        encoded: list[bool] = []

        def no_lane(address: str) -> Any:  # no stream: every request on the unary path
            return None

        monkeypatch.setattr(client._lanes, "lane", no_lane)
        real_unary = client.transport.unary

        async def unary(service: str, method: str, request: Any, **kw: Any) -> Any:
            if method == "Publish":
                encoded.append(request.HasField("encoded") and not request.messages)
            return await real_unary(service, method, request, **kw)

        monkeypatch.setattr(client.transport, "unary", unary)
        results = await client.publish_batch("sess-spread", [b"v%d" % i for i in range(2500)])
        partitions = [r.partition for r in results]
        # As requests of keyless messages go (a sticky partition, the next one after each
        # request): each 1000 of a call to one partition, in order, never two at once.
        assert len(set(partitions[:1000])) == len(set(partitions[1000:2000])) == 1
        assert len({partitions[0], partitions[1000], partitions[2000]}) == 3
        for p in set(partitions):
            offsets = [r.offset for r in results if r.partition == p]
            assert offsets == list(range(len(offsets)))
        assert len(encoded) == 3 and all(encoded)  # each 1000 one Publish of encoded records
