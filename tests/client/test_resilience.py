"""SDK through broker failures: kill -9 and restart of a single node, loss of a cluster node."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluxmq.client import AsyncClient, Message
from fluxmq.devcluster.launcher import LocalCluster
from tests.integration.cluster import PATIENT, Cluster, started
from tests.integration.conftest import Node
from tests.integration.test_cluster_cli import free_port_range

pytestmark = pytest.mark.slow


async def fetch_values(client: AsyncClient, queue: str, partition: int = 0) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    for _ in range(1000):
        resp = await client.fetch(queue, partition, offset)
        out.extend(r.value for r in resp.records)
        if resp.next_offset >= resp.high_watermark:
            return out
        offset = resp.next_offset
    raise AssertionError("fetch did not reach the end")


async def test_buffered_producer_survives_broker_restart_without_duplicates(node: Node) -> None:
    n = 2000
    async with AsyncClient(node.address, retry=PATIENT) as client:
        await client.admin.create_queue("restart")
        restarted = asyncio.Event()

        def kill_and_restart() -> None:
            node.kill9()
            node.start()  # same port and data dir; returns once it serves

        restart: asyncio.Future[None] | None = None
        async with client.producer("restart", max_messages=50, linger_ms=2) as producer:
            futures = []
            for i in range(n):
                futures.append(await producer.send(f"v{i}".encode()))
                if i == 600:  # mid-stream: requests are in flight when the node dies
                    restart = asyncio.ensure_future(asyncio.to_thread(kill_and_restart))
                    restart.add_done_callback(lambda _f: restarted.set())
                if i % 50 == 0:
                    await asyncio.sleep(0.002)  # spread the stream over the restart
        assert restart is not None
        await asyncio.wait_for(restart, 60)
        results = [await f for f in futures]
        values = await fetch_values(client, "restart")
    counts = Counter(values)
    assert len(values) == n and set(counts.values()) == {1}  # every value exactly once
    assert set(counts) == {f"v{i}".encode() for i in range(n)}
    assert sorted(r.offset for r in results) == list(range(n))
    assert restarted.is_set() and producer.sent_messages == n
    assert client.transport.retries > 0  # requests failed while the node was down


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with started(Cluster(tmp_path / "cluster", 3)) as c:
        yield c


async def test_failover_to_another_node_keeps_publishing_and_consuming(cluster: Cluster) -> None:
    """kill -9 the node the client sends the queue's calls to, mid-stream: publishes and
    consumes go on through the others, and every message is consumed."""
    addresses = [n.address for n in cluster.nodes]
    async with AsyncClient(addresses, retry=PATIENT, timeout_s=5) as client:
        assert client.transport.current == addresses[0]
        await client.admin.create_queue("fo", type="work", partitions=2)
        await client.admin.create_group("fo", "g")
        seen: Counter[bytes] = Counter()
        stop = asyncio.Event()
        total = 400

        async def handle(msg: Message) -> None:
            seen[msg.value] += 1
            if len(seen) == total:
                stop.set()

        consuming = asyncio.ensure_future(
            client.consume("fo", "g", handle, lease_ms=2000, wait_ms=200, stop=stop, batch=20)
        )
        # A tail of the queue too: its stream is on the same node, and goes on elsewhere from
        # the last record it handed out.
        tail = client.tail("fo")
        tailed: Counter[bytes] = Counter()

        async def tail_all() -> None:
            async for rec in tail:
                tailed[rec.value] += 1
                if sum(tailed.values()) == total:
                    return

        tailing = asyncio.ensure_future(tail_all())
        async with client.producer("fo", max_messages=20, linger_ms=2) as producer:
            for i in range(total // 2):
                await producer.send(f"m{i}".encode())
        await asyncio.sleep(0.2)
        # The node the queue's calls go to (its leader once learned): killing another one
        # would leave nothing for the client to fail over from.
        victim = client.transport.target("fo")
        t0 = time.monotonic()
        next(n for n in cluster.nodes if n.address == victim).kill9()
        async with client.producer("fo", max_messages=20, linger_ms=2) as producer:
            for i in range(total // 2, total):
                await producer.send(f"m{i}".encode())
        took = time.monotonic() - t0
        assert client.transport.target("fo") != victim, (victim, client.transport)
        assert client.transport.retries > 0
        await asyncio.wait_for(consuming, 30)
        assert set(seen) == {f"m{i}".encode() for i in range(total)}
        with contextlib.suppress(TimeoutError):  # what is missing is said below
            await asyncio.wait_for(tailing, 30)
        await tail.close()
        missing = [f"m{i}" for i in range(total) if f"m{i}".encode() not in tailed]
        doubled = [v for v, n in tailed.items() if n > 1]
        assert not missing and not doubled, (missing[:10], doubled[:10], tail.positions)
        assert tail.reconnects >= 1
        desc = await client.admin.describe_group("fo", "g")
        assert sum(p.acked for p in desc.partitions) == total
        assert took < 20


def publish_calls(metrics_address: str) -> float:
    """Successful Publish calls a node answered, from its /metrics."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("fluxmq_rpc_duration_seconds_count{")
            and 'method="Publish"' in line
            and 'code="OK"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    lc = LocalCluster(tmp_path / "lc", base_port=free_port_range(), etcd_port=0)
    try:
        lc.up()
        yield lc
    finally:
        lc.down(purge=True)


async def test_leader_cache_sends_calls_to_the_queue_leader_and_follows_it(
    etcd_cluster: LocalCluster,
) -> None:
    """With etcd, answers name the leader (x-fluxmq-leader): the client sends the queue's next
    calls there; when that leader dies it fails over and learns the new one."""
    specs = etcd_cluster.specs()
    addresses = [s.address for s in specs]
    async with AsyncClient(
        addresses[::-1], retry=PATIENT, timeout_s=5, api_key=etcd_cluster.api_key()
    ) as client:
        await client.admin.create_queue("lead")
        await client.publish("lead", b"first")
        leader = client.transport.leader_of("lead")
        assert leader in addresses
        i = addresses.index(leader)
        before = [publish_calls(s.metrics_address) for s in specs]
        streamed = client._pipelines["lead"].requests_streamed
        for k in range(20):
            await client.publish("lead", f"m{k}".encode())
        after = [publish_calls(s.metrics_address) for s in specs]
        # They travel on one PublishStream to the leader (fluxmq/client/pipeline.py): no node
        # answered (or forwarded to the leader) a Publish call of its own.
        assert list(client._lanes._lanes) == [leader]
        assert client._pipelines["lead"].requests_streamed - streamed == 20
        assert [a - b for a, b in zip(after, before, strict=True)] == [0.0] * len(specs)
        etcd_cluster.kill9(i + 1)
        for k in range(20, 40):  # go on through the others
            await client.publish("lead", f"m{k}".encode())

        async def new_leader() -> str | None:
            await client.publish("lead", b"probe")
            now = client.transport.leader_of("lead")
            return now if now not in (None, leader) else None

        deadline = time.monotonic() + 20
        while (found := await new_leader()) is None:
            assert time.monotonic() < deadline, "the new leader was never learned"
            await asyncio.sleep(0.2)
        assert found in addresses
        values = await fetch_values(client, "lead")
        assert values[:41] == [b"first"] + [f"m{k}".encode() for k in range(40)]
