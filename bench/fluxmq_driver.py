"""Drives a FluxMQ node with the standard workloads.

The client sends pre-serialized requests (the same bytes every time, apart from nothing that the
server would treat differently), so the client's CPU goes to the network and not to building
protobufs: on a 2-core machine the client shares the cores with the broker, and the number we
want is the broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.record_batches import add_records, encode_records
from fluxmq.server.shard_process.supervisor import child_pids

PUBLISH = "/fluxmq.v1.QueueService/Publish"
FETCH = "/fluxmq.v1.QueueService/Fetch"
CREATE = "/fluxmq.v1.QueueService/CreateQueue"
CREATE_GROUP = "/fluxmq.v1.QueueService/CreateGroup"
LEASE = "/fluxmq.v1.QueueService/Lease"
ACK = "/fluxmq.v1.QueueService/Ack"
CONSUME = "/fluxmq.v1.QueueService/Consume"


def _identity(b: bytes) -> bytes:
    return b


@dataclass
class RunResult:
    workload: str
    messages: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    params: dict[str, object] = field(default_factory=dict)
    # Measurements beyond the main latency column (per-call percentiles, counts, ...).
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msg_per_s": round(self.rate),
            "p50_ms": round(self.percentile(0.50), 3),
            "p95_ms": round(self.percentile(0.95), 3),
            "p99_ms": round(self.percentile(0.99), 3),
            "p999_ms": round(self.percentile(0.999), 3),
            "client_cpu_s": round(self.client_cpu_s, 2),
            "server_cpu_s": round(self.server_cpu_s, 2),
            **self.params,
            **self.detail,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process ``pid`` so far; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (a node's shard process), from /proc."""
    out, todo = [], [pid]
    while todo:
        children = child_pids(todo.pop())
        out += children
        todo += children
    return out


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` and the processes under it; None when ``pid`` is gone."""
    own = process_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(process_cpu_seconds(child) or 0.0 for child in descendants(pid))


class FluxNode:
    """A `fluxmq serve` process on loopback, with a fresh data dir."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.extra = extra  # more `fluxmq serve` arguments (cluster mode: --raft-listen ...)
        self.env = env  # more environment variables of the process
        self.proc: subprocess.Popen[bytes] | None = None
        self._cpu_last = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn()
        self.wait_listening()

    def spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "node.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fluxmq", "serve", "--data-dir", str(self.data_dir / "data"),
             "--listen", self.address, "--metrics-listen", "", "--log-level", "WARNING",
             *self.extra],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
        )  # fmt: skip

    def wait_listening(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"FluxMQ node exited early, see {self.data_dir / 'node.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("FluxMQ node did not start")

    def cpu_seconds(self) -> float:
        """User + system CPU of the node so far, its shard process included (the last reading
        once it has exited)."""
        assert self.proc is not None
        seconds = tree_cpu_seconds(self.proc.pid)
        if seconds is not None:
            self._cpu_last = seconds
        return self._cpu_last

    def log_tail(self, lines: int = 40) -> str:
        """The end of the node's log (stdout and stderr), to show when a run fails."""
        try:
            text = (self.data_dir / "node.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def create_queue(address: str, name: str, partitions: int, *, work: bool = False) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(CREATE, request_serializer=_identity, response_deserializer=_identity)
        config = pb.QueueConfig(name=name, partitions=partitions)
        if work:
            config.type = pb.QUEUE_TYPE_WORK
        req = pb.CreateQueueRequest(config=config)
        await call(req.SerializeToString(), timeout=10)


async def create_group(address: str, queue: str, group: str) -> None:
    """A shared (competing consumers) group reading from the earliest offset."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(
            CREATE_GROUP, request_serializer=_identity, response_deserializer=_identity
        )
        req = pb.CreateGroupRequest(queue=queue, group=group)
        await call(req.SerializeToString(), timeout=10)


async def paced(
    step: Callable[[], Awaitable[None]],
    more: Callable[[], bool],
    start: float,
    stop_at: float,
    interval: float | None,
    concurrency: int,
) -> None:
    """``concurrency`` loops calling ``step`` until ``stop_at`` or ``more()`` is false: closed
    loops (``interval`` None) or each paced to one call per ``interval``, staggered."""

    async def loop(k: int) -> None:
        next_at = start + (interval or 0) * k / concurrency
        while time.perf_counter() < stop_at and more():
            if interval is not None:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at += interval
            await step()

    await asyncio.gather(*(loop(k) for k in range(concurrency)))


def publish_request(queue: str, batch: int, size: int) -> bytes:
    value = os.urandom(size)
    req = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)] * batch)
    return bytes(req.SerializeToString())


def encoded_publish_request(queue: str, batch: int, size: int, partition: int) -> bytes:
    """A Publish of ``batch`` records the client encoded (``PublishRequest.encoded``), for one
    partition: what the SDK sends."""
    value = os.urandom(size)
    records = encode_records([pb.PublishMessage(value=value)] * batch)
    req = pb.PublishRequest(
        queue=queue,
        encoded=pb.EncodedRecords(partition=partition, count=batch, records=records),
    )
    return bytes(req.SerializeToString())


async def publish_workload(
    address: str,
    queue: str,
    *,
    size: int,
    batch: int,
    concurrency: int,
    duration_s: float,
    messages_max: int,
    rate_max: float | None = None,
    encoded_partitions: int = 0,
) -> RunResult:
    """``concurrency`` publishers, each a closed loop of Publish calls (or paced to ``rate_max``
    messages/s in total, for latency at a given load). Bounded by time and by count.
    ``encoded_partitions``: each call carries encoded records (``PublishRequest.encoded``) of
    one partition, the calls taking the partitions in turn; 0: messages, partitioned by the
    broker."""
    if encoded_partitions:
        bodies = [encoded_publish_request(queue, batch, size, p) for p in range(encoded_partitions)]
    else:
        bodies = [publish_request(queue, batch, size)]
    body = bodies[0]
    turn = 0
    latencies: list[float] = []
    sent = 0
    cpu0 = time.process_time()
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(
            PUBLISH, request_serializer=_identity, response_deserializer=_identity
        )
        await call(body, timeout=10)  # warm-up
        start = time.perf_counter()
        stop_at = start + duration_s
        interval = None if rate_max is None else batch * concurrency / rate_max

        async def publish_once() -> None:
            nonlocal sent, turn
            turn += 1
            t0 = time.perf_counter()
            await call(bodies[turn % len(bodies)], timeout=30)
            latencies.append((time.perf_counter() - t0) * 1000)
            sent += batch

        await paced(
            publish_once, lambda: sent < messages_max, start, stop_at, interval, concurrency
        )
        elapsed = time.perf_counter() - start
    return RunResult(
        "publish",
        sent,
        elapsed,
        latencies,
        client_cpu_s=time.process_time() - cpu0,
        params={"size": size, "batch": batch, "concurrency": concurrency, "rate_max": rate_max},
    )


async def fetch_workload(
    address: str,
    queue: str,
    partitions: int,
    *,
    batch: int,
    concurrency: int,
    messages_max: int,
    record_batches: bool = True,
) -> RunResult:
    """``concurrency`` readers, each reading whole partitions from offset 0 to the end. With
    ``record_batches`` (the SDK's way) the broker answers with its stored batches and the
    readers check and decode them here (fluxmq/client/record_batches.py), so the client pays
    the decoding as a real one does."""
    latencies: list[float] = []
    received = 0
    cpu0 = time.process_time()
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(
            FETCH, request_serializer=_identity, response_deserializer=pb.FetchResponse.FromString
        )
        start = time.perf_counter()

        async def reader(k: int) -> None:
            nonlocal received
            for partition in range(k, partitions, concurrency):
                offset = 0
                while received < messages_max:
                    req = pb.FetchRequest(
                        queue=queue,
                        partition=partition,
                        offset=offset,
                        max_messages=batch,
                        max_bytes=16 * 1024 * 1024,
                        record_batches=record_batches,
                    )
                    t0 = time.perf_counter()
                    resp = await call(req.SerializeToString(), timeout=30)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    records = _decoded(resp, partition, offset) if record_batches else resp.records
                    if not records:
                        break
                    received += len(records)
                    offset = resp.next_offset

        await asyncio.gather(*(reader(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - start
    return RunResult(
        "fetch",
        received,
        elapsed,
        latencies,
        client_cpu_s=time.process_time() - cpu0,
        params={"batch": batch, "concurrency": concurrency},
    )


def _decoded(
    resp: pb.FetchResponse, partition: int, offset: int
) -> RepeatedCompositeFieldContainer[pb.Record]:
    """The records of ``resp``'s batches from ``offset`` on, decoded as ``Client.fetch`` does
    (in place, in an answer's repeated field)."""
    out = pb.FetchResponse()
    add_records(out.records, resp.record_batches, resp.log_id, partition, offset)
    return out.records


# -- consumer groups ----------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    ys = sorted(xs)
    return round(ys[min(len(ys) - 1, int(q * len(ys)))], 3)


def _pcts(name: str, xs: list[float]) -> dict[str, object]:
    return {f"{name}_p{k}_ms": _pct(xs, q) for k, q in (("50", 0.5), ("95", 0.95), ("99", 0.99))}


async def lease_ack_workload(
    address: str,
    queue: str,
    group: str,
    *,
    batch: int,
    concurrency: int,
    duration_s: float,
    expected: int,
) -> RunResult:
    """``concurrency`` consumers of one shared group (a consumer_id each), each a closed loop of
    Lease(max_messages=batch, no wait) + Ack(the receipts just leased), until a Lease comes back
    empty (the queue is drained) or ``duration_s`` passes. The time is taken up to the last Ack.
    The queue must be filled beforehand (``expected`` messages)."""
    lease_lat: list[float] = []
    ack_lat: list[float] = []
    cycle_lat: list[float] = []
    acked = 0
    not_acked = 0
    redelivered = 0
    last_ack = 0.0
    cpu0 = time.process_time()
    async with grpc.aio.insecure_channel(address) as ch:
        lease = ch.unary_unary(
            LEASE, request_serializer=_identity, response_deserializer=pb.LeaseResponse.FromString
        )
        ack = ch.unary_unary(
            ACK, request_serializer=_identity, response_deserializer=pb.AckResponse.FromString
        )
        start = time.perf_counter()
        stop_at = start + duration_s

        async def consumer(k: int) -> None:
            nonlocal acked, not_acked, redelivered, last_ack
            body = pb.LeaseRequest(
                queue=queue, group=group, consumer_id=f"bench-{k}", max_messages=batch, wait_ms=0
            ).SerializeToString()
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                resp = await lease(body, timeout=30)
                t1 = time.perf_counter()
                lease_lat.append((t1 - t0) * 1000)
                if not resp.messages:
                    break
                receipts = [m.receipt for m in resp.messages]
                redelivered += sum(1 for r in receipts if r.attempt != 1)
                req = pb.AckRequest(queue=queue, group=group, receipts=receipts)
                t2 = time.perf_counter()
                res = await ack(req.SerializeToString(), timeout=30)
                t3 = time.perf_counter()
                ack_lat.append((t3 - t2) * 1000)
                cycle_lat.append((t3 - t0) * 1000)
                ok = sum(1 for s in res.statuses if s == pb.RECEIPT_STATUS_ACKED)
                acked += ok
                not_acked += len(receipts) - ok
                last_ack = max(last_ack, t3)

        await asyncio.gather(*(consumer(k) for k in range(concurrency)))
        elapsed = (last_ack or time.perf_counter()) - start
    return RunResult(
        "lease_ack",
        acked,
        elapsed,
        cycle_lat,
        client_cpu_s=time.process_time() - cpu0,
        params={"batch": batch, "concurrency": concurrency},
        detail={
            "prefilled": expected,
            "drained": acked >= expected,
            "not_acked": not_acked,
            "redelivered": redelivered,
            "lease_calls": len(lease_lat),
            **_pcts("lease", lease_lat),
            **_pcts("ack", ack_lat),
        },
    )


_STAMP = b"\xa5TSTAMP\x5a"  # 8 bytes in the value, replaced by the publish time (struct "<d")


async def consume_workload(
    address: str,
    queue: str,
    group: str,
    *,
    size: int,
    batch: int,
    concurrency: int,
    duration_s: float,
    messages_max: int,
    rate_max: float | None = None,
    max_in_flight: int = 1000,
    drain_s: float = 5.0,
) -> RunResult:
    """End-to-end latency, publish -> delivered on a Consume stream.

    ``concurrency`` publishers (closed loop, or paced to ``rate_max`` messages/s in total) send
    batches whose values start with the time the Publish call was made (perf_counter, the same
    process reads it back); one Consume stream (``max_in_flight``) takes them and acks each
    response as one Ack, in the background. The latency of a message is the time its response
    arrived on the stream minus its publish time. Publishing is bounded by time and by count;
    afterwards the stream gets up to ``drain_s`` to deliver the rest (0: stop at once, for a
    saturation run). msg/s = messages delivered while publishing / publishing time."""
    value = _STAMP + os.urandom(size - len(_STAMP))
    template = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)] * batch)
    body0 = bytes(template.SerializeToString())
    assert body0.count(_STAMP) == batch
    latencies: list[float] = []
    ack_lat: list[float] = []
    pub_lat: list[float] = []
    published = 0
    delivered = 0  # timed messages only (published after start)
    delivered_in_window = 0
    redelivered = 0
    not_acked = 0
    acks: set[asyncio.Task[None]] = set()
    cpu0 = time.process_time()
    async with grpc.aio.insecure_channel(address) as ch:
        publish = ch.unary_unary(
            PUBLISH, request_serializer=_identity, response_deserializer=_identity
        )
        ack = ch.unary_unary(
            ACK, request_serializer=_identity, response_deserializer=pb.AckResponse.FromString
        )
        consume = ch.unary_stream(
            CONSUME, request_serializer=_identity,
            response_deserializer=pb.ConsumeResponse.FromString,
        )  # fmt: skip
        stream = consume(
            pb.ConsumeRequest(
                queue=queue, group=group, consumer_id="bench-consume",
                max_in_flight=max_in_flight, batch_max=min(1000, max_in_flight),
            ).SerializeToString()
        )  # fmt: skip
        warm = asyncio.Event()
        done = asyncio.Event()
        start = float("inf")

        async def settle(receipts: list[pb.Receipt]) -> None:
            nonlocal not_acked
            t0 = time.perf_counter()
            res = await ack(
                pb.AckRequest(queue=queue, group=group, receipts=receipts).SerializeToString(),
                timeout=30,
            )
            ack_lat.append((time.perf_counter() - t0) * 1000)
            not_acked += sum(1 for s in res.statuses if s != pb.RECEIPT_STATUS_ACKED)

        async def consumer() -> None:
            nonlocal delivered, redelivered
            unpack = struct.Struct("<d").unpack_from
            async for resp in stream:
                now = time.perf_counter()
                receipts = []
                for m in resp.messages:
                    receipts.append(m.receipt)
                    if m.receipt.attempt != 1:
                        redelivered += 1
                    (sent_at,) = unpack(m.record.value)
                    if sent_at >= start:
                        latencies.append((now - sent_at) * 1000)
                        delivered += 1
                task = asyncio.ensure_future(settle(receipts))
                acks.add(task)
                task.add_done_callback(acks.discard)
                warm.set()
                if done.is_set() and delivered >= published:
                    return

        reader = asyncio.ensure_future(consumer())
        # Warm-up: one batch through publish, the stream and Ack, not counted.
        await publish(body0.replace(_STAMP, struct.pack("<d", 0.0)), timeout=10)
        await asyncio.wait_for(warm.wait(), 30)
        start = time.perf_counter()
        stop_at = start + duration_s
        interval = None if rate_max is None else batch * concurrency / rate_max

        async def publish_once() -> None:
            nonlocal published
            t0 = time.perf_counter()
            await publish(body0.replace(_STAMP, struct.pack("<d", t0)), timeout=30)
            pub_lat.append((time.perf_counter() - t0) * 1000)
            published += batch

        await paced(
            publish_once,
            lambda: published < messages_max,
            start,
            stop_at,
            interval,
            concurrency,
        )
        elapsed = time.perf_counter() - start
        delivered_in_window = delivered
        done.set()
        if drain_s > 0 and delivered < published:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), drain_s)
        reader.cancel()
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reader
        if acks:
            await asyncio.gather(*acks, return_exceptions=True)
    return RunResult(
        "consume_latency",
        delivered_in_window,
        elapsed,
        latencies,
        client_cpu_s=time.process_time() - cpu0,
        params={
            "size": size, "batch": batch, "concurrency": concurrency,
            "max_in_flight": max_in_flight, "rate_max": rate_max,
        },
        detail={
            "published": published,
            "published_per_s": round(published / elapsed) if elapsed else 0,
            "delivered": delivered,
            "not_acked": not_acked,
            "redelivered": redelivered,
            **_pcts("publish", pub_lat),
            **_pcts("ack", ack_lat),
        },
    )  # fmt: skip
