"""SIGTERM drains the calls that wait: long polls (Lease, Fetch with wait_ms), Consume and Tail
streams end within about a second with a retriable UNAVAILABLE / NODE_SHUTTING_DOWN instead of
hanging until the grace period cancels them, and the node exits promptly."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.client import AsyncClient, Message
from fluxmq.client.errors import FluxMQError, from_rpc_error
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.app import build_server
from fluxmq.server.router import Router
from fluxmq.server.shard.runtime import ShardRuntime
from raft import LocalShard
from storage import MemoryStore
from tests.integration.cluster import PATIENT, Cluster, started
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error

LONG_POLL_MS = 30_000
# The node's grace period is 20 s (the default): a call that ends well before it was drained,
# not cancelled. Generous bounds: this machine is noisy.
ENDED_WITHIN_S = 5.0
EXITED_WITHIN_S = 10.0


@dataclass
class Ended:
    name: str
    at: float
    error: grpc.RpcError | None
    items: int = 0


def _run(name: str, call: Callable[[], int], out: list[Ended], lock: threading.Lock) -> None:
    try:
        items = call()
        ended = Ended(name, time.monotonic(), None, items)
    except grpc.RpcError as err:
        ended = Ended(name, time.monotonic(), err)
    with lock:
        out.append(ended)


@pytest.mark.slow
def test_sigterm_ends_long_polls_and_streams_at_once_with_node_shutting_down(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="drain")), timeout=10)
        stub.CreateGroup(pb.CreateGroupRequest(queue="drain", group="g"), timeout=10)

        def lease(i: int) -> Callable[[], int]:
            def call() -> int:
                resp = stub.Lease(
                    pb.LeaseRequest(
                        queue="drain", group="g", consumer_id=f"poll-{i}", wait_ms=LONG_POLL_MS
                    ),
                    timeout=60,
                )
                return len(resp.messages)

            return call

        def consume() -> int:
            stream = stub.Consume(
                pb.ConsumeRequest(queue="drain", group="g", consumer_id="stream"), timeout=60
            )
            return sum(len(r.messages) for r in stream)

        def tail() -> int:
            stream = stub.Tail(pb.TailRequest(queue="drain"), timeout=60)
            return sum(len(r.records) for r in stream)

        def fetch() -> int:
            resp = stub.Fetch(
                pb.FetchRequest(queue="drain", partition=0, offset=0, wait_ms=LONG_POLL_MS),
                timeout=60,
            )
            return len(resp.records)

        calls = {f"Lease#{i}": lease(i) for i in range(5)}
        calls |= {"Consume": consume, "Tail": tail, "Fetch": fetch}
        ended: list[Ended] = []
        lock = threading.Lock()
        threads = [
            threading.Thread(target=_run, args=(name, call, ended, lock), name=name, daemon=True)
            for name, call in calls.items()
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every call is waiting on the node (nothing to deliver)
        assert not ended, [(e.name, e.error) for e in ended]

        assert node.proc is not None
        sigterm_at = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        exit_code = node.proc.wait(30)
        exited_s = time.monotonic() - sigterm_at

    assert sorted(e.name for e in ended) == sorted(calls)
    last_s = max(e.at for e in ended) - sigterm_at
    print(f"\nwaiting calls ended within {last_s:.2f} s of SIGTERM; exited after {exited_s:.2f} s")
    for e in ended:
        after_s = e.at - sigterm_at
        assert e.error is not None, f"{e.name} ended OK with {e.items} items"
        assert after_s < ENDED_WITHIN_S, f"{e.name} ended {after_s:.1f} s after SIGTERM"
        err = rich_error(e.error)
        assert err.code == grpc.StatusCode.UNAVAILABLE, (e.name, err)
        assert err.reason == "NODE_SHUTTING_DOWN", (e.name, err)
        assert err.metadata["retriable"] == "true", (e.name, err)
    assert exit_code == 0
    assert exited_s < EXITED_WITHIN_S, f"the node exited {exited_s:.1f} s after SIGTERM"
    log = node.log_path.read_text()
    assert "stopped cleanly" in log, log[-3000:]


class GatedShard(LocalShard):
    """A LocalShard whose proposals wait at ``gate`` while it is closed: writes in flight."""

    def __init__(self, state: QueueStateMachine) -> None:
        super().__init__(state)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        if not self.gate.is_set():
            self.held += 1
            await self.gate.wait()
        return await super().propose(payload, deadline, on_append=on_append)


@dataclass
class InProcess:
    broker: ShardRuntime
    shard: GatedShard
    stub: queue_pb2_grpc.QueueServiceStub


@pytest.fixture
async def in_process() -> AsyncIterator[InProcess]:
    state = QueueStateMachine(MemoryStore())
    shard = GatedShard(state)
    broker = ShardRuntime(state, shard)
    await broker.start()
    server, _health, port = build_server(
        Router.of_one(broker), "127.0.0.1:0", request_bytes_max=1 << 20
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield InProcess(broker, shard, queue_pb2_grpc.QueueServiceStub(ch))
    finally:
        shard.gate.set()
        await server.stop(None)
        await broker.close()


async def shutting_down(call: Awaitable[Any]) -> FluxMQError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    err = from_rpc_error(info.value)
    assert err.code == grpc.StatusCode.UNAVAILABLE, err
    assert err.reason == "NODE_SHUTTING_DOWN" and err.retriable, err
    return err


def publish(stub: queue_pb2_grpc.QueueServiceStub, queue: str, *values: bytes) -> Any:
    return stub.Publish(
        pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=v) for v in values])
    )


async def test_draining_ends_waits_while_in_flight_writes_and_leases_complete(
    in_process: InProcess,
) -> None:
    stub, shard = in_process.stub, in_process.shard
    for q in ("work", "idle"):
        await stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=q)))
        await stub.CreateGroup(pb.CreateGroupRequest(queue=q, group="g"))
    await publish(stub, "work", b"a", b"b")
    held = await stub.Lease(
        pb.LeaseRequest(queue="work", group="g", consumer_id="c1", max_messages=1)
    )
    assert [m.record.value for m in held.messages] == [b"a"]  # b stays ready

    shard.gate.clear()  # from here every write stays in flight until the gate opens
    leasing = asyncio.ensure_future(
        stub.Lease(pb.LeaseRequest(queue="work", group="g", consumer_id="c2", wait_ms=30_000))
    )
    publishing = asyncio.ensure_future(publish(stub, "work", b"c"))
    acking = asyncio.ensure_future(
        stub.Ack(pb.AckRequest(queue="work", group="g", receipts=[held.messages[0].receipt]))
    )
    waiting = asyncio.ensure_future(
        stub.Lease(pb.LeaseRequest(queue="idle", group="g", consumer_id="w", wait_ms=30_000))
    )
    deadline = time.monotonic() + 10
    while shard.held < 3:  # the lease of b, the publish of c and the ack of a
        assert time.monotonic() < deadline, shard.held
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not waiting.done()

    t0 = time.monotonic()
    in_process.broker.drain()
    await shutting_down(waiting)  # while the writes are still held
    assert time.monotonic() - t0 < 2.0  # within a moment (1 s asked; a noisy machine)
    assert not (leasing.done() or publishing.done() or acking.done())

    shard.gate.set()
    leased = await leasing  # a lease already proposed is answered, not dropped
    assert [m.record.value for m in leased.messages] == [b"b"]
    assert (await publishing).results[0].offset == 2
    assert list((await acking).statuses) == [pb.RECEIPT_STATUS_ACKED]

    # Draining: nothing waits or leases any more; writes and plain reads are still served.
    await shutting_down(stub.Lease(pb.LeaseRequest(queue="work", group="g", consumer_id="c3")))
    await shutting_down(
        stub.Fetch(pb.FetchRequest(queue="work", partition=0, offset=3, wait_ms=30_000))
    )
    stream = stub.Consume(pb.ConsumeRequest(queue="work", group="g", consumer_id="c4"))
    await shutting_down(stream.read())
    tail = stub.Tail(pb.TailRequest(queue="work"))
    await shutting_down(tail.read())
    fetched = await stub.Fetch(pb.FetchRequest(queue="work", partition=0, offset=0))
    assert [r.value for r in fetched.records] == [b"a", b"b", b"c"]
    acked = await stub.Ack(
        pb.AckRequest(queue="work", group="g", receipts=[leased.messages[0].receipt])
    )
    assert list(acked.statuses) == [pb.RECEIPT_STATUS_ACKED]
    assert (await publish(stub, "work", b"d")).results[0].offset == 3


HALF = 100  # messages published before the SIGTERM, and as many after it
SLOW = 4  # of the first half: still being handled at the SIGTERM, acked during the drain
MOVED_WITHIN_S = 5.0  # after the SIGTERM; the node's grace period is 20 s
CONSUMER_POLL_MS = 10_000  # the SDK consumer's long poll: idle on the node at the SIGTERM


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with started(Cluster(tmp_path / "cluster", 3)) as c:
        yield c


@pytest.mark.slow
async def test_sdk_consumer_moves_to_another_node_on_sigterm_and_acks_each_message_once(
    cluster: Cluster,
) -> None:
    """The SDK consumes through the leader; it is idle in a 30 s long poll and still handling
    a few messages when the leader gets SIGTERM. The consumer moves to another node at once
    (not when the grace period cancels its poll), the acks of the messages it was handling
    are applied, the node exits promptly, and what is published afterwards is consumed
    through the others: every message acked, none twice."""
    first = cluster.wait_leader()  # the consumer's node, leading too: the harder case
    others = [n for n in cluster.nodes if n is not first]
    values = [f"m{i:04d}".encode() for i in range(2 * HALF)]
    slow = set(values[HALF - SLOW : HALF])  # handled across the SIGTERM
    acks: defaultdict[bytes, list[str]] = defaultdict(list)
    started: set[bytes] = set()
    fast_acked, slow_started, release, all_acked = (asyncio.Event() for _ in range(4))

    async def handle(msg: Message) -> None:
        if msg.value in slow:
            started.add(msg.value)
            if started == slow:
                slow_started.set()
            await release.wait()
        try:
            status = await msg.ack(wait=True)
        except FluxMQError as err:  # the lease is gone: redelivered, acked again later
            status = f"failed: {err.reason}"
        acks[msg.value].append(str(status))
        if all(ok_acks(acks.get(v, [])) for v in values[:HALF] if v not in slow):
            fast_acked.set()
        if all(ok_acks(acks.get(v, [])) for v in values):
            all_acked.set()

    addresses = [first.address] + [n.address for n in others]
    async with (
        AsyncClient(addresses, retry=PATIENT, timeout_s=5) as client,
        AsyncClient([n.address for n in others], retry=PATIENT, timeout_s=5) as publisher,
    ):
        await client.admin.create_queue("drain", type="work", partitions=2)
        await client.admin.create_group("drain", "g")
        stop = asyncio.Event()
        consuming = asyncio.ensure_future(
            client.consume(
                "drain", "g", handle, concurrency=2 * SLOW, batch=20, lease_ms=3000,
                wait_ms=CONSUMER_POLL_MS, stop=stop,
            )
        )  # fmt: skip
        await publisher.publish_batch("drain", values[:HALF])
        await asyncio.wait_for(asyncio.gather(fast_acked.wait(), slow_started.wait()), 30)
        assert client.transport.current == first.address
        await asyncio.sleep(0.5)  # the consumer's long poll now waits on the first node

        assert first.proc is not None
        sigterm_at = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)
        moved_s = await until(lambda: client.transport.current != first.address, 30)
        release.set()  # the held messages are acked now, through whichever node
        exit_code = await asyncio.to_thread(first.proc.wait, 30)
        exited_s = time.monotonic() - sigterm_at
        for i in range(HALF, 2 * HALF, 10):
            await publisher.publish_batch("drain", values[i : i + 10])
        await asyncio.wait_for(all_acked.wait(), 60)
        stop.set()
        # A stop lets the consumer's current long poll end (documented): up to its wait_ms.
        stats = await asyncio.wait_for(consuming, CONSUMER_POLL_MS / 1000 + 30)
        desc = await client.admin.describe_group("drain", "g")

    redelivered = {v: a for v, a in acks.items() if len(a) > 1}
    print(
        f"\nconsumer moved {moved_s - sigterm_at:.2f} s after SIGTERM, node exited after "
        f"{exited_s:.2f} s; {stats.acked} acked, {len(redelivered)} redelivered: {redelivered}"
    )
    assert moved_s - sigterm_at < MOVED_WITHIN_S, "the long poll was not ended by the drain"
    assert exit_code == 0 and exited_s < EXITED_WITHIN_S, (exit_code, exited_s)
    assert set(acks) == set(values)  # nothing lost, nothing unexpected
    for v in values:
        assert ok_acks(acks[v]) == 1, f"{v!r} acked {acks[v]}"  # exactly once
    assert sum(p.acked for p in desc.partitions) == len(values)


async def until(predicate: Callable[[], bool], timeout_s: float) -> float:
    """-> the monotonic time ``predicate`` first held (checked every 20 ms)."""
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s")


def ok_acks(statuses: list[str]) -> int:
    """Acks the broker applied (ALREADY_ACKED: a retried ack whose first attempt was applied)."""
    return sum(1 for s in statuses if s in ("ACKED", "ALREADY_ACKED"))
