"""The SDK's StreamReader against a real broker: a stream queue read as a group that only
tracks offsets (no lease, no replicated round per record), committed in the background."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc
from fluxmq.client import AsyncClient, StreamRecord
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow


async def take(reader: object, n: int, timeout_s: float = 10) -> list[StreamRecord]:
    out: list[StreamRecord] = []

    async def go() -> None:
        async for rec in reader:  # type: ignore[attr-defined]
            out.append(rec)
            if len(out) == n:
                return

    await asyncio.wait_for(go(), timeout_s)
    return out


def applied_index(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        status = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(apb.GetClusterStatusRequest())
    return max(s.applied_index for s in status.shards)


async def test_a_reader_reads_each_partition_in_order_and_goes_on_where_it_committed(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("events", type="stream", partitions=2)
        await client.admin.create_group("events", "audit")
        await client.publish_batch("events", [f"e{i}".encode() for i in range(40)])
        async with client.reader("events", "audit", commit_interval_ms=0) as reader:
            got = await take(reader, 40)
        assert sorted(r.value for r in got) == sorted(f"e{i}".encode() for i in range(40))
        for p in (0, 1):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == list(range(len(offsets)))
        # Closing committed the position: the group's lag is 0, a new reader sees only new ones.
        assert all(o.lag == 0 for o in await client.admin.get_offsets("events", "audit"))
        await client.publish_batch("events", [b"late-1", b"late-2"])
        async with client.reader("events", "audit") as again:
            assert sorted(r.value for r in await take(again, 2)) == [b"late-1", b"late-2"]


async def test_groups_each_read_everything_without_a_replicated_round_per_record(
    broker: Node,
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("fanout", type="stream")
        readers = [
            client.reader("fanout", f"g{i}", create_group=True, commit_interval_ms=0)
            for i in range(3)
        ]
        for r in readers:
            await r.start()
        await client.publish("fanout", b"m-first")  # the client's producer session starts
        before = applied_index(broker.address)
        await client.publish_batch("fanout", [f"m{i}".encode() for i in range(50)])
        want = [b"m-first"] + [f"m{i}".encode() for i in range(50)]
        for r in readers:
            assert [x.value for x in await take(r, 51)] == want
        # One round for the publish; reading 3 x 50 records took none.
        assert applied_index(broker.address) == before + 1
        for r in readers:
            await r.close()  # one commit each
        assert applied_index(broker.address) == before + 4


async def test_a_reader_of_an_unknown_group_fails_with_not_found(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("nogroup", type="stream")
        reader = client.reader("nogroup", "missing")
        with pytest.raises(Exception) as err:
            await reader.start()
        assert "GROUP_NOT_FOUND" in str(err.value) or "NOT_FOUND" in str(err.value)
