"""FluxMQ as a peer of the comparison: the same `fluxmq serve` processes as the rest of bench/
(one node, or three Raft replicas of one shard). Client authentication is off either way (the
3 replicas have static peers and no etcd, so no key store); `python -m bench.auth_overhead`
measures what it costs.

Two clients, as two "brokers" of the comparison: ``fluxmq`` publishes through the Python SDK
(``AsyncClient.publish`` / ``publish_batch``: concurrent single publishes share requests,
sent in a producer session), as the peers' adapters use their official clients;
``fluxmq-raw`` sends pre-built Publish requests on raw gRPC stubs (no keys). Both receive on
raw stubs as RabbitMQ's adapter does: one long-lived Consume stream per (queue, group) with a
credit of ``PREFETCH`` (RabbitMQ's prefetch), feeding a buffer that ``receive`` takes from;
acks are Ack calls. ``fanout_offsets`` reads a stream queue with the SDK's ``client.reader``
(one per (queue, group); Fetch long polls woken at commit, offsets committed every second)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import grpc

from bench.cluster import FluxCluster
from bench.fluxmq_driver import FluxNode
from bench.peers.api import Delivered
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.client import AsyncClient

DURABILITY = (
    "Publish answers OK after the records are fsync'd to LMDB (1 node), or appended to the Raft "
    "journal and fsync'd on a majority and applied on the leader (3 nodes); acks and leases are "
    "replicated commands with the same rule"
)


PREFETCH = 500  # a Consume stream's max_in_flight: RabbitMQ's adapter's prefetch
STREAM_BATCH_MAX = 100
READ_WAIT_MS = 1000  # a reader's Fetch long poll (a commit wakes it sooner)


T = TypeVar("T")


async def _take(buf: asyncio.Queue[T], max_messages: int, wait_ms: int) -> list[T]:
    """Up to ``max_messages`` of ``buf``, waiting up to ``wait_ms`` for the first."""
    if buf.empty():
        try:
            first = await asyncio.wait_for(buf.get(), timeout=max(wait_ms, 0) / 1000)
        except TimeoutError:
            return []
    else:
        first = buf.get_nowait()
    out = [first]
    while len(out) < max_messages and not buf.empty():
        out.append(buf.get_nowait())
    return out


class _Stream:
    """One Consume stream of a (queue, group), read into a buffer by a task."""

    def __init__(self, stub: queue_pb2_grpc.QueueServiceStub, queue: str, group: str) -> None:
        self.buffer: asyncio.Queue[pb.LeasedMessage] = asyncio.Queue()
        self.call = stub.Consume(
            pb.ConsumeRequest(
                queue=queue,
                group=group,
                consumer_id=f"bench-{queue}-{group}",
                max_in_flight=PREFETCH,
                batch_max=STREAM_BATCH_MAX,
            )
        )
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            for m in response.messages:
                self.buffer.put_nowait(m)

    def close(self) -> None:
        self.call.cancel()
        self.task.cancel()


class _Reading:
    """One ``client.reader`` of a (stream, group), read into a buffer by a task."""

    def __init__(self, client: AsyncClient, queue: str, group: str) -> None:
        self.buffer: asyncio.Queue[bytes] = asyncio.Queue()
        self.reader = client.reader(queue, group, wait_ms=READ_WAIT_MS)
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for rec in self.reader:
            self.buffer.put_nowait(rec.value)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.reader.close()


class FluxAdapter:
    durability = DURABILITY

    def __init__(self, address: str, nodes: int, pids: list[int], *, sdk: bool = True) -> None:
        self.name = "fluxmq" if sdk else "fluxmq-raw"
        self.address = address
        self.nodes = nodes
        self._pids = pids
        self._sdk = sdk
        self._client: AsyncClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: queue_pb2_grpc.QueueServiceStub | None = None
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._readings: dict[tuple[str, str], _Reading] = {}
        self._reading_client: AsyncClient | None = None

    async def connect(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = queue_pb2_grpc.QueueServiceStub(self._channel)
        if self._sdk:
            self._client = AsyncClient(self.address)
            await self._client.connect()

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        for reading in self._readings.values():
            await reading.close()
        self._readings.clear()
        if self._reading_client is not None and self._reading_client is not self._client:
            await self._reading_client.close()
        self._reading_client = None
        if self._client is not None:
            await self._client.close()
        if self._channel is not None:
            await self._channel.close()

    @property
    def stub(self) -> queue_pb2_grpc.QueueServiceStub:
        assert self._stub is not None, "connect() first"
        return self._stub

    async def create_queue(self, queue: str, groups: Sequence[str]) -> None:
        config = pb.QueueConfig(name=queue, partitions=1, type=pb.QUEUE_TYPE_WORK)
        await self.stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=10)
        for group in groups:
            await self.stub.CreateGroup(pb.CreateGroupRequest(queue=queue, group=group), timeout=10)

    async def create_stream(self, queue: str, groups: Sequence[str]) -> None:
        config = pb.QueueConfig(name=queue, partitions=1, type=pb.QUEUE_TYPE_STREAM)
        await self.stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=10)
        for group in groups:
            await self.stub.CreateGroup(pb.CreateGroupRequest(queue=queue, group=group), timeout=10)

    async def read(self, queue: str, group: str, max_messages: int, wait_ms: int) -> list[bytes]:
        reading = self._readings.get((queue, group))
        if reading is None:
            if self._reading_client is None:
                # The SDK's reader either way: it is how a user reads a stream (Fetch long
                # polls woken at commit, offsets committed in the background).
                self._reading_client = self._client or AsyncClient(self.address)
                if self._reading_client is not self._client:
                    await self._reading_client.connect()
            reading = self._readings[(queue, group)] = _Reading(self._reading_client, queue, group)
        return await _take(reading.buffer, max_messages, wait_ms)

    async def publish(self, queue: str, payloads: Sequence[bytes]) -> None:
        if self._client is not None:
            if len(payloads) == 1:
                await self._client.publish(queue, payloads[0])
            else:
                await self._client.publish_batch(queue, payloads)
            return
        messages = [pb.PublishMessage(value=p) for p in payloads]
        await self.stub.Publish(pb.PublishRequest(queue=queue, messages=messages), timeout=30)

    async def receive(
        self, queue: str, group: str, max_messages: int, wait_ms: int
    ) -> list[Delivered]:
        stream = self._streams.get((queue, group))
        if stream is None:
            stream = self._streams[(queue, group)] = _Stream(self.stub, queue, group)
        out = await _take(stream.buffer, max_messages, wait_ms)
        return [Delivered(m.record.value, m.receipt) for m in out]

    async def ack(self, queue: str, group: str, messages: Sequence[Delivered]) -> None:
        if messages:
            await self.stub.Ack(
                pb.AckRequest(queue=queue, group=group, receipts=[m.handle for m in messages]),
                timeout=30,
            )

    def server_pids(self) -> list[int]:
        return list(self._pids)


class FluxPeerCluster:
    """One `fluxmq serve` node, or three replicas; clients talk to the (first) leader, through
    the SDK (``sdk``) or raw stubs."""

    def __init__(self, root: Path, nodes: int, *, sdk: bool = True) -> None:
        assert nodes in (1, 3), nodes
        self.name = "fluxmq" if sdk else "fluxmq-raw"
        self.sdk = sdk
        self.nodes = nodes
        self._single = FluxNode(root / "n0") if nodes == 1 else None
        self._cluster = FluxCluster(root, nodes) if nodes > 1 else None
        self._leader: FluxNode | None = None

    def start(self) -> None:
        if self._single is not None:
            self._single.start()
            self._leader = self._single
            return
        assert self._cluster is not None
        self._cluster.start()
        self._leader = asyncio.run(self._cluster.wait_leader())

    def stop(self) -> None:
        if self._single is not None:
            self._single.stop()
        if self._cluster is not None:
            self._cluster.stop()

    def _all(self) -> list[FluxNode]:
        return [self._single] if self._single is not None else list(self._cluster.nodes)  # type: ignore[union-attr]

    def adapter(self) -> FluxAdapter:
        assert self._leader is not None, "start() first"
        pids = [n.proc.pid for n in self._all() if n.proc is not None]
        return FluxAdapter(self._leader.address, self.nodes, pids, sdk=self.sdk)

    def leader_node(self) -> FluxNode:
        assert self._leader is not None, "start() first"
        return self._leader

    def versions(self) -> dict[str, str]:
        return {"fluxmq": metadata.version("fluxmq"), "grpcio": grpc.__version__}

    def __enter__(self) -> FluxPeerCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
