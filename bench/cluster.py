"""A 3-replica FluxMQ cluster on loopback, and the failover workload.

Each replica is a `fluxmq serve` process in cluster mode (``--raft-listen``/``--peers``, the
shared secret in FLUXMQ_CLUSTER_SECRET, static peers without etcd, so client authentication
off) with a fresh data dir; the leader is found through AdminService.GetClusterStatus.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from pathlib import Path

import grpc

from bench.fluxmq_driver import (
    PUBLISH,
    FluxNode,
    RunResult,
    _identity,
    free_port,
    publish_request,
)
from fluxmq._pb.v1 import admin_pb2

STATUS = "/fluxmq.v1.AdminService/GetClusterStatus"
SECRET = "bench-cluster-secret-0123456789abcdef"
# Errors after which a client tries the next node (the leader is gone, an election is running,
# a forwarded proposal lost its leader).
RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class FluxCluster:
    """``n`` replicas of one shard, each a FluxNode with its own gRPC and Raft ports."""

    def __init__(self, root: Path, n: int = 3) -> None:
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.nodes = [
            FluxNode(
                root / f"n{i}",
                "--raft-listen", addr,
                "--peers", ",".join(a for a in self.raft if a != addr),
                # No etcd, so no key store: auth off (bench.auth_overhead measures its cost).
                "--auth", "off",
                env={"FLUXMQ_CLUSTER_SECRET": SECRET},
            )
            for i, addr in enumerate(self.raft)
        ]  # fmt: skip

    def start(self) -> None:
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            node.wait_listening()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def alive(self) -> list[FluxNode]:
        return [n for n in self.nodes if n.alive()]

    def cpu_seconds(self) -> list[float]:
        return [n.cpu_seconds() for n in self.nodes]

    async def status(self, node: FluxNode) -> admin_pb2.ShardInfo | None:
        try:
            async with grpc.aio.insecure_channel(node.address) as ch:
                call = ch.unary_unary(
                    STATUS,
                    request_serializer=_identity,
                    response_deserializer=admin_pb2.ClusterStatus.FromString,
                )
                st = await call(admin_pb2.GetClusterStatusRequest().SerializeToString(), timeout=2)
        except grpc.aio.AioRpcError:
            return None
        return st.shards[0] if st.shards else None

    async def wait_leader(self, timeout_s: float = 30.0) -> FluxNode:
        """The live node that reports itself leader (and is the leader its peers report)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.alive():
                info = await self.status(node)
                if info is not None and info.role == "leader":
                    return node
            await asyncio.sleep(0.05)
        raise RuntimeError("no leader elected")

    async def wait_converged(self, timeout_s: float = 30.0) -> bool:
        """Every live replica applied the same index (the followers caught up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            infos = [await self.status(n) for n in self.alive()]
            if all(i is not None for i in infos) and (
                len({i.applied_index for i in infos if i is not None}) == 1
            ):
                return True
            await asyncio.sleep(0.1)
        return False


async def failover_workload(
    cluster: FluxCluster,
    queue: str,
    *,
    size: int,
    batch: int,
    concurrency: int,
    rate: float,
    before_s: float,
    after_s: float,
    timeout_s: float = 30.0,
    attempt_timeout_s: float = 2.0,
) -> RunResult:
    """Publishers paced to ``rate`` messages/s in total send to the leader; after ``before_s``
    the leader gets SIGKILL. A publish that fails with a retriable code (``RETRY_CODES``) or
    takes longer than ``attempt_timeout_s`` is sent again, to the next live node (a follower
    forwards it to the new leader once there is one). Publishing goes on ``after_s`` after the
    first post-kill acknowledgement (at most ``timeout_s`` after the kill).

    failover_s = kill -> the first acknowledgement of a publish attempt sent after the kill
    (in-flight calls that were answered just after the kill do not count). Latencies are per
    publish, retries included."""
    leader = await cluster.wait_leader()
    order = [leader] + [n for n in cluster.nodes if n is not leader]
    body = publish_request(queue, batch, size)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    acked_at: list[tuple[float, float]] = []  # (attempt start, acknowledged)
    sent = 0
    retries = 0
    kill_at = float("inf")
    cpu0 = time.process_time()
    channels = [grpc.aio.insecure_channel(n.address) for n in order]
    try:
        calls = [
            ch.unary_unary(PUBLISH, request_serializer=_identity, response_deserializer=_identity)
            for ch in channels
        ]
        await calls[0](body, timeout=10)  # warm-up
        target = [0] * concurrency  # each client's node (index into order)
        start = time.perf_counter()
        stop_at = start + before_s + timeout_s + after_s

        def more() -> bool:
            first = min((a for s, a in acked_at if s >= kill_at), default=None)
            return first is None or time.perf_counter() < first + after_s

        async def publish_once(k: int) -> None:
            nonlocal sent, retries
            t0 = time.perf_counter()
            while True:
                t1 = time.perf_counter()
                try:
                    await calls[target[k]](body, timeout=attempt_timeout_s)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in RETRY_CODES:
                        raise
                    errors[err.code().name] += 1
                    retries += 1
                    target[k] = (target[k] + 1) % len(calls)
                    if time.perf_counter() > stop_at:
                        return
                    await asyncio.sleep(0.01)
                    continue
                now = time.perf_counter()
                acked_at.append((t1, now))
                latencies.append((now - t0) * 1000)
                sent += batch
                return

        async def killer() -> None:
            nonlocal kill_at
            await asyncio.sleep(before_s)
            leader.cpu_seconds()  # its last reading, for the CPU columns
            kill_at = time.perf_counter()
            assert leader.proc is not None
            leader.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(leader.proc.wait, 10)

        async def client(k: int) -> None:
            interval = batch * concurrency / rate
            next_at = start + interval * k / concurrency
            while time.perf_counter() < stop_at and more():
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at += interval
                await publish_once(k)

        await asyncio.gather(killer(), *(client(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        for ch in channels:
            with contextlib.suppress(Exception):
                await ch.close()
    after_kill = [a for s, a in acked_at if s >= kill_at]
    any_after = [a for _, a in acked_at if a >= kill_at]
    new_leader = None
    with contextlib.suppress(RuntimeError):
        new_leader = await cluster.wait_leader(5)
    return RunResult(
        "cluster_failover",
        sent,
        elapsed,
        latencies,
        client_cpu_s=time.process_time() - cpu0,
        params={"size": size, "batch": batch, "concurrency": concurrency, "rate_max": rate},
        detail={
            "failover_s": round(min(after_kill) - kill_at, 3) if after_kill else "none",
            "first_ack_after_kill_s": round(min(any_after) - kill_at, 3) if any_after else "none",
            "retries": retries,
            **{f"errors_{code}": n for code, n in sorted(errors.items())},
            "max_publish_ms": round(max(latencies), 1) if latencies else "none",
            "new_leader": "found" if new_leader is not None else "none",
        },
    )
