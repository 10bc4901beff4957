"""SDK against a real broker: round trips, the blocking client, errors, retry rules."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from fluxmq.client import (
    NO_RETRY,
    AsyncClient,
    Client,
    InvalidArgument,
    OutgoingMessage,
    QueueExists,
    QueueNotFound,
    RetryPolicy,
    Unavailable,
)
from fluxmq.client._transport import should_retry
from fluxmq.client.errors import FluxMQError
from tests.integration.conftest import Node, free_port

pytestmark = pytest.mark.slow


async def test_publish_consume_round_trip_keeps_values_keys_headers_and_delay(broker: Node) -> None:
    cases = {
        "bytes": [b"\x00\xffraw", b""],
        "str": ["héllo", "wörld"],
        "json": [{"order": 7, "items": [1, 2]}, "text", 3.5, None],
    }
    async with AsyncClient(broker.address) as client:
        for codec, values in cases.items():
            queue = f"rt-{codec}"
            await client.admin.create_queue(queue, type="work")
            results = await client.publish_batch(
                queue,
                [
                    OutgoingMessage(v, key=f"k{i}", headers={"n": str(i), "raw": b"\x01"})
                    for i, v in enumerate(values)
                ],
                codec=codec,
            )
            assert [r.offset for r in results] == list(range(len(values)))
            got = []
            async with asyncio.timeout(10):
                async with client.consumer(
                    queue, "g", codec=codec, create_group=True, wait_ms=200
                ) as consumer:
                    async for msg in consumer:
                        got.append(msg)
                        if len(got) == len(values):
                            break
            assert [m.data for m in got] == values, codec
            assert [m.key for m in got] == [f"k{i}".encode() for i in range(len(values))]
            assert [m.headers for m in got] == [
                {"n": str(i).encode(), "raw": b"\x01"} for i in range(len(values))
            ]
            assert [(m.partition, m.offset, m.attempt) for m in got] == [
                (0, i, 1) for i in range(len(values))
            ]
            # auto_ack acked every message: nothing left for the group
            desc = await client.admin.describe_group(queue, "g")
            assert desc.partitions[0].acked == len(values)
            assert desc.partitions[0].in_flight == 0

        # A delayed message is invisible until due; the explicit partition and key hold.
        await client.admin.create_queue("rt-delay", type="work", partitions=3)
        await client.admin.create_group("rt-delay", "g")
        sent = await client.publish("rt-delay", b"later", delay_ms=800, partition=2, key="k")
        now_ms = await client.publish("rt-delay", b"now", partition=1)
        seen: list[tuple[bytes, float]] = []
        stop = asyncio.Event()

        async def handle(msg):  # type: ignore[no-untyped-def]
            seen.append((msg.value, time.time() * 1000))
            if len(seen) == 2:
                stop.set()

        async with asyncio.timeout(10):
            stats = await client.consume("rt-delay", "g", handle, stop=stop, wait_ms=200)
        assert [v for v, _ in seen] == [b"now", b"later"]
        assert seen[1][1] >= sent.timestamp_ms + 800 - 50  # same host clock; 50 ms slack
        assert (sent.partition, now_ms.partition) == (2, 1)
        assert stats.acked == 2 and stats.handler_errors == 0


async def test_buffered_producer_flushes_on_count_bytes_and_time(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("buf")
        # count: 250 messages with max_messages=100 -> 3 requests
        async with client.producer("buf", max_messages=100, linger_ms=10_000) as p:
            futs = [await p.send(i) for i in range(250)]
            # The first two requests also start the session; wait for both to be answered.
            await asyncio.wait_for(asyncio.gather(*futs[:200]), 10)
            await asyncio.sleep(0.05)
            assert p.sent_requests == 2  # two full batches left; the rest waits for linger
        assert p.sent_requests == 3  # leaving the block flushed the rest
        assert [(await f).offset for f in futs] == list(range(250))
        # bytes: 1 KiB values, max_bytes 4 KiB -> a request every 4 messages
        p = client.producer("buf", max_bytes=4096, linger_ms=10_000)
        futs = [await p.send(b"x" * 1024) for _ in range(8)]
        await asyncio.wait_for(asyncio.gather(*futs), 5)
        assert p.sent_requests == 2
        await p.close()
        # time: a lone message leaves linger_ms after it was buffered
        p = client.producer("buf", linger_ms=200)
        t0 = time.monotonic()
        result = await asyncio.wait_for(await p.send(b"lone"), 5)
        assert 0.2 <= time.monotonic() - t0 < 3 and result.offset == 258
        await p.close()
        assert (await client.fetch("buf", 0, 258)).records[0].value == b"lone"
        # the same idempotency key again is a duplicate
        a = await client.publish("buf", b"once", idempotency_key="evt-1")
        b = await client.publish("buf", b"once", idempotency_key="evt-1")
        assert b.duplicate and (b.partition, b.offset) == (a.partition, a.offset)


def test_sync_client_round_trip(broker: Node) -> None:
    with Client(broker.address) as client:
        client.admin.create_queue("sync", type="work")
        client.admin.create_group("sync", "g")
        first = client.publish("sync", "hello", key="k1")
        with client.producer("sync", linger_ms=1) as producer:
            futs = [producer.send({"n": i}) for i in range(10)]
        assert [f.result(5).offset for f in futs] == list(range(1, 11))
        seen = []
        with client.consumer("sync", "g", wait_ms=200, auto_ack=False) as consumer:
            for msg in consumer:
                seen.append(msg.value)
                assert msg.ack(wait=True) == "ACKED"
                if len(seen) == 11:
                    break
        assert seen[0] == b"hello" and first.offset == 0
        assert seen[1:] == [f'{{"n":{i}}}'.encode() for i in range(10)]

        client.publish_batch("sync", [b"a", b"b", b"c"])
        stop = threading.Event()
        got: list[bytes] = []

        def handle(msg) -> None:  # type: ignore[no-untyped-def]
            got.append(msg.value)
            if len(got) == 3:
                stop.set()

        stats = client.consume("sync", "g", handle, stop=stop, wait_ms=200, concurrency=2)
        assert sorted(got) == [b"a", b"b", b"c"] and stats.acked == 3
        assert "sync" in [q.config.name for q in client.admin.list_queues()]
        assert client.admin.describe_group("sync", "g").partitions[0].acked == 14


async def test_errors_unknown_queue_is_queue_not_found_with_request_id_and_reason(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        with pytest.raises(QueueNotFound) as info:
            await client.publish("no-such-queue", b"x")
        err = info.value
        assert err.code == grpc.StatusCode.NOT_FOUND
        assert err.reason == "QUEUE_NOT_FOUND" and err.from_broker and not err.retriable
        assert len(err.request_id) >= 16 and err.request_id in str(err)
        assert err.metadata["queue"] == "no-such-queue"
        with pytest.raises(QueueNotFound):
            async with client.consumer("no-such-queue", "g") as consumer:
                await consumer.__anext__()
        await client.admin.create_queue("dup")
        with pytest.raises(QueueExists):
            await client.admin.create_queue("dup")
        assert (await client.admin.create_queue("dup", exist_ok=True)).config.name == "dup"


async def test_errors_bad_argument_has_field_violations(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        with pytest.raises(InvalidArgument) as info:
            await client.admin.create_queue("bad name!")
        assert [v.field for v in info.value.field_violations] == ["config.name"]
        assert info.value.reason == "INVALID_ARGUMENT" and info.value.request_id
        await client.admin.create_queue("one-partition")
        with pytest.raises(InvalidArgument) as info:
            await client.publish("one-partition", b"x", partition=5)
        assert info.value.reason == "PARTITION_OUT_OF_RANGE"
        assert [v.field for v in info.value.field_violations] == ["messages[0].partition"]


async def test_an_argument_its_field_cannot_hold_fails_before_anything_is_sent(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("bad-arguments", partitions=2)
        with pytest.raises(InvalidArgument) as info:
            await client.publish("bad-arguments", b"x", partition=-1)
        assert [v.field for v in info.value.field_violations] == ["partition"]
        with pytest.raises(InvalidArgument) as info:
            await client.publish_batch(
                "bad-arguments", [OutgoingMessage(b"a"), OutgoingMessage(b"b", delay_ms=-1)]
            )
        assert [v.field for v in info.value.field_violations] == ["delay_ms"]
        stats = await client.admin.queue_stats("bad-arguments")
        assert stats.messages == 0  # the good message of the batch was not sent either
        assert (await client.publish("bad-arguments", b"ok", partition=1)).partition == 1


async def test_unreachable_seed_fails_over_to_the_next(broker: Node) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with AsyncClient([dead, broker.address]) as client:
        await client.admin.create_queue("seeds", exist_ok=True)
        result = await client.publish("seeds", b"x")
        assert result.offset == 0 and client.transport.current == broker.address
    async with AsyncClient(dead, retry=RetryPolicy(max_attempts=3, max_backoff_s=0.05)) as client:
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as info:
            await client.publish("seeds", b"x")
        assert info.value.retriable and not info.value.from_broker
        assert time.monotonic() - t0 < 5
        with pytest.raises(Unavailable):
            await client.admin.get_queue("seeds")


def test_retry_rules() -> None:
    def err(code: grpc.StatusCode, reason: str = "", **kw: object) -> FluxMQError:
        return FluxMQError(code, "m", reason=reason, **kw)  # type: ignore[arg-type]

    busy = err(grpc.StatusCode.RESOURCE_EXHAUSTED, "SHARD_BUSY", retriable=True, from_broker=True)
    unknown = err(grpc.StatusCode.UNAVAILABLE, "OUTCOME_UNKNOWN", retriable=True, from_broker=True)
    missing = err(grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", from_broker=True)
    down = err(grpc.StatusCode.UNAVAILABLE, retriable=True)
    refused = FluxMQError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    late = err(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert should_retry(busy, safe=False) and should_retry(busy, safe=True)
    assert should_retry(unknown, safe=True) and not should_retry(unknown, safe=False)
    assert not should_retry(missing, safe=True)
    assert should_retry(down, safe=True) and not should_retry(down, safe=False)
    assert should_retry(refused, safe=False)
    assert should_retry(late, safe=True) and not should_retry(late, safe=False)
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0)
    delays = [policy.backoff_s(n) for n in range(1, 9)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert NO_RETRY.max_attempts == 1


async def test_stats_count_what_the_client_did(broker: Node) -> None:
    """``client.stats()``: messages and bytes published, requests, retries, what consumers
    leased and acked and still hold, and per node the calls timed."""
    async with AsyncClient(broker.address) as client:
        before = client.stats()
        await client.admin.create_queue("counted", type="work", partitions=1)
        await client.admin.create_group("counted", "g")
        async with client.producer("counted", max_messages=10, linger_ms=2) as producer:
            for i in range(25):
                await producer.send(f"m{i:02d}".encode())  # 3 bytes each
        mid = client.stats()
        assert mid.messages_sent - before.messages_sent == 25
        assert mid.bytes_sent - before.bytes_sent >= 25 * 3
        assert mid.requests_sent >= 3 and mid.messages_waiting == 0
        async with client.consumer("counted", "g", batch=5, wait_ms=100) as consumer:
            n = 0
            async for msg in consumer:
                n += 1
                if n == 10:
                    now = client.stats()
                    assert now.consumed.leased >= 10 and now.messages_held >= 1
                    await msg.ack()
                    break
        after = client.stats()
        assert after.consumed.acked >= 10 and after.messages_held == 0
        (node,) = after.nodes.values()
        assert node.calls >= 5 and node.errors == 0 and 0 < node.mean_ms < 10_000
        assert node.seconds_max >= node.mean_ms / 1000
        assert after.retries == 0
    with Client(broker.address) as sync:
        sync.publish("counted", b"x")
        assert sync.stats().messages_sent == 1
