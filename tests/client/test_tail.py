"""``client.tail()``: every partition merged or one, from earliest, latest, an offset or a
time, records handed out in each partition's order; against a real node (both shard process
layouts). Failover (kill -9 of the node the stream is on) is in test_resilience."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from fluxmq.client import AsyncClient, Client, Tail
from tests.integration.conftest import Node

TIMEOUT_S = 20


async def take(tail: Tail, n: int) -> list[tuple[int, int, bytes]]:
    out = []
    async with asyncio.timeout(TIMEOUT_S):
        async for rec in tail:
            out.append((rec.partition, rec.offset, rec.value))
            if len(out) == n:
                break
    return out


async def test_tail_merges_partitions_in_order_and_starts_where_asked(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("tailed", partitions=2)
        for i in range(6):
            await client.publish("tailed", f"v{i}".encode(), partition=i % 2)
        async with client.tail("tailed") as tail:
            got = await take(tail, 6)
        assert sorted(v for _, _, v in got) == [f"v{i}".encode() for i in range(6)]
        for p in (0, 1):
            assert [o for q, o, _ in got if q == p] == [0, 1, 2]  # each partition in order
        async with client.tail("tailed", partition=1, start=1) as tail:
            assert [v for _, _, v in await take(tail, 2)] == [b"v3", b"v5"]
        # latest: only what is appended after it opened
        async with client.tail("tailed", start="latest") as tail:
            await tail.start()
            await client.publish("tailed", b"new", partition=0)
            assert await take(tail, 1) == [(0, 3, b"new")]
        # a time after everything: only what comes later
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
        async with client.tail("tailed", partitions=[0], start=later) as tail:
            await tail.start()
            await asyncio.sleep(1.2)
            await client.publish("tailed", b"after", partition=0)
            assert [v for _, _, v in await take(tail, 1)] == [b"after"]
        with pytest.raises(ValueError, match="no partition 5"):
            await client.tail("tailed", partition=5).start()
        with pytest.raises(ValueError, match="time zone"):
            client.tail("tailed", start=datetime.datetime(2026, 1, 1))
        with pytest.raises(ValueError, match="not both"):
            client.tail("tailed", partition=0, partitions=[1])


def test_the_blocking_client_tails_and_reads_a_stream(broker: Node) -> None:
    """``Client.tail()`` and ``Client.reader()``: blocking iterators over the same objects."""
    with Client(broker.address) as client:
        client.admin.create_queue("tailed-sync", partitions=1)
        client.admin.create_group("tailed-sync", "g")
        for i in range(3):
            client.publish("tailed-sync", f"s{i}".encode())
        with client.tail("tailed-sync", start=1) as tail:
            got = [next(tail).value for _ in range(2)]
        assert got == [b"s1", b"s2"]
        with client.reader("tailed-sync", "g") as reader:
            assert [next(reader).value for _ in range(3)] == [b"s0", b"s1", b"s2"]
        # leaving the reader committed its position
        (offsets,) = client.admin.get_offsets("tailed-sync", "g")
        assert offsets.committed == 3
