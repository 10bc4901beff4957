"""Cluster metadata and membership benchmarks (issue 5), on etcd + 3 nodes on loopback:

- rebalance: a member joins an ordered group of 100 partitions held by 4 members; the time until
  every partition is owned per the new assignment, nothing revoking or pending, in ms and in
  heartbeat intervals. Members behave like the protocol asks: heartbeat every interval, and
  acknowledge a revocation at once (nothing is in flight).
- queues: 1,000 queues created through the three nodes (8 concurrent clients), then listed
  through one node, page by page.

Authentication is on, as in every cluster: each call carries the cluster's admin API key.

    python -m bench.cluster_meta [--dir /tmp/fluxmq-bench-meta] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.devcluster.launcher import LocalCluster, port_free

PARTITIONS = 100
SESSION_MS = 3000
QUEUES = 1000

Metadata = tuple[tuple[str, str], ...]


def auth_metadata(api_key: str) -> Metadata:
    """gRPC metadata presenting ``api_key`` (the LocalCluster's admin key)."""
    return (("authorization", f"Bearer {api_key}"),)


class SimMember:
    """A member that follows the protocol and does no work."""

    def __init__(
        self, stub: queue_pb2_grpc.QueueServiceStub, queue: str, consumer: str, md: Metadata
    ) -> None:
        self.stub, self.queue, self.consumer, self.md = stub, queue, consumer, md
        self.a = pb.MemberAssignment()
        self.task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        self.a = await self.stub.JoinGroup(
            pb.JoinGroupRequest(
                queue=self.queue,
                group="g",
                consumer_id=self.consumer,
                session_timeout_ms=SESSION_MS,
            ),
            metadata=self.md,
        )
        self.task = asyncio.create_task(self._beat_routine())

    async def _beat(self) -> None:
        self.a = await self.stub.Heartbeat(
            pb.HeartbeatRequest(
                queue=self.queue,
                group="g",
                member_id=self.a.member_id,
                generation_id=self.a.generation_id,
            ),
            metadata=self.md,
        )

    async def _beat_routine(self) -> None:
        while True:
            await asyncio.sleep(self.a.heartbeat_interval_ms / 1000)
            await self._beat()
            if self.a.revoking:  # nothing in flight: acknowledge at once
                await self._beat()

    async def leave(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.stub.LeaveGroup(
            pb.LeaveGroupRequest(queue=self.queue, group="g", member_id=self.a.member_id),
            metadata=self.md,
        )


def settled(desc: pb.GroupDescription, members: int) -> bool:
    owned = sorted(p for m in desc.members for p in m.assigned)
    moving = any(m.revoking or m.pending for m in desc.members)
    return len(desc.members) == members and owned == list(range(PARTITIONS)) and not moving


async def wait_settled(
    stub: queue_pb2_grpc.QueueServiceStub, queue: str, members: int, md: Metadata
) -> None:
    for _ in range(6000):  # bounded: 60 s
        desc = await stub.DescribeGroup(
            pb.DescribeGroupRequest(queue=queue, group="g"), metadata=md
        )
        if settled(desc, members):
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the group did not settle in 60 s")


async def rebalance(addresses: list[str], rounds: int, md: Metadata) -> list[float]:
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [queue_pb2_grpc.QueueServiceStub(c) for c in channels]
    queue = "rebalance"
    await stubs[0].CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name=queue, partitions=PARTITIONS)),
        metadata=md,
    )
    await stubs[0].CreateGroup(
        pb.CreateGroupRequest(queue=queue, group="g", mode=pb.DELIVERY_MODE_ORDERED),
        metadata=md,
    )
    members = [SimMember(stubs[i % 3], queue, f"c{i}", md) for i in range(4)]
    for m in members:
        await m.join()
    await wait_settled(stubs[0], queue, 4, md)
    took: list[float] = []
    for r in range(rounds):
        newcomer = SimMember(stubs[r % 3], queue, f"new{r}", md)
        t0 = time.monotonic()
        await newcomer.join()
        await wait_settled(stubs[0], queue, 5, md)
        took.append((time.monotonic() - t0) * 1000)
        await newcomer.leave()
        await wait_settled(stubs[0], queue, 4, md)
    for m in members:
        await m.leave()
    for c in channels:
        await c.close()
    return took


async def queues(addresses: list[str], md: Metadata) -> tuple[float, float, int]:
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [queue_pb2_grpc.QueueServiceStub(c) for c in channels]
    names = iter(range(QUEUES))

    async def creator(k: int) -> None:
        for i in names:
            await stubs[(k + i) % 3].CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=f"q{i:05d}")),
                timeout=30,
                metadata=md,
            )

    t0 = time.monotonic()
    await asyncio.gather(*(creator(k) for k in range(8)))
    created_s = time.monotonic() - t0
    t1 = time.monotonic()
    listed, token = 0, ""
    for _ in range(100):
        resp = await stubs[2].ListQueues(
            pb.ListQueuesRequest(prefix="q", limit=1000, page_token=token), metadata=md
        )
        listed += len(resp.queues)
        token = resp.next_page_token
        if not token:
            break
    listed_s = time.monotonic() - t1
    for c in channels:
        await c.close()
    return created_s, listed_s, listed


def free_base_port(span: int = 30) -> int:
    """A base with ``span`` free consecutive ports below the ephemeral range."""
    for base in range(20_000, 32_000, span):
        if all(port_free(p) for p in range(base, base + span)):
            return base
    raise RuntimeError("no free port range in 20000..32000")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_meta", description=__doc__)
    ap.add_argument("--dir", default="")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="fluxmq-bench-meta-"))
    cluster = LocalCluster(root, nodes=3, base_port=free_base_port(), etcd_port=0)
    cluster.up()
    try:
        addresses = cluster.node_addresses
        md = auth_metadata(cluster.api_key())
        took = asyncio.run(rebalance(addresses, args.rounds, md))
        interval_ms = SESSION_MS // 3
        print(
            f"rebalance of {PARTITIONS} partitions, 4 -> 5 members, {args.rounds} rounds: "
            f"median {statistics.median(took):.0f} ms, max {max(took):.0f} ms "
            f"= {max(took) / interval_ms:.2f} heartbeat intervals of {interval_ms} ms"
        )
        created_s, listed_s, listed = asyncio.run(queues(addresses, md))
        print(
            f"{QUEUES} queues created through 3 nodes in {created_s:.2f} s "
            f"({QUEUES / created_s:.0f}/s); listed {listed} through one node in "
            f"{listed_s * 1000:.0f} ms"
        )
    finally:
        cluster.down(purge=True)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
