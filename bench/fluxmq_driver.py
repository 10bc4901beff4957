"""Drives a FluxMQ node with the standard workloads.

The client sends pre-serialized requests (the same bytes every time, apart from nothing that the
server would treat differently), so the client's CPU goes to the network and not to building
protobufs: on a 2-core machine the client shares the cores with the broker, and the number we
want is the broker's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb

PUBLISH = "/fluxmq.v1.QueueService/Publish"
FETCH = "/fluxmq.v1.QueueService/Fetch"
CREATE = "/fluxmq.v1.QueueService/CreateQueue"


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
            "p99_ms": round(self.percentile(0.99), 3),
            "p999_ms": round(self.percentile(0.999), 3),
            "client_cpu_s": round(self.client_cpu_s, 2),
            "server_cpu_s": round(self.server_cpu_s, 2),
            **self.params,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FluxNode:
    """A `fluxmq serve` process on loopback, with a fresh data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "node.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fluxmq", "serve", "--data-dir", str(self.data_dir / "data"),
             "--listen", self.address, "--metrics-listen", "", "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("FluxMQ node did not start")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def create_queue(address: str, name: str, partitions: int) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(CREATE, request_serializer=_identity, response_deserializer=_identity)
        req = pb.CreateQueueRequest(config=pb.QueueConfig(name=name, partitions=partitions))
        await call(req.SerializeToString(), timeout=10)


def publish_request(queue: str, batch: int, size: int) -> bytes:
    value = os.urandom(size)
    req = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)] * batch)
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
) -> RunResult:
    """``concurrency`` publishers, each a closed loop of Publish calls (or paced to ``rate_max``
    messages/s in total, for latency at a given load). Bounded by time and by count."""
    body = publish_request(queue, batch, size)
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

        async def publisher(k: int) -> None:
            nonlocal sent
            next_at = start + (interval or 0) * k / concurrency
            while time.perf_counter() < stop_at and sent < messages_max:
                if interval is not None:
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    next_at += interval
                t0 = time.perf_counter()
                await call(body, timeout=30)
                latencies.append((time.perf_counter() - t0) * 1000)
                sent += batch

        await asyncio.gather(*(publisher(k) for k in range(concurrency)))
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
    address: str, queue: str, partitions: int, *, batch: int, concurrency: int, messages_max: int
) -> RunResult:
    """``concurrency`` readers, each reading whole partitions from offset 0 to the end."""
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
                    )
                    t0 = time.perf_counter()
                    resp = await call(req.SerializeToString(), timeout=30)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    if not resp.records:
                        break
                    received += len(resp.records)
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
