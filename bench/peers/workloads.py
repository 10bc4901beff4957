"""The comparison's workloads, written once against ``bench.peers.api.Adapter``.

- ``publish``: ``concurrency`` publishers, each a closed loop of publish calls of ``batch``
  messages of ``size`` bytes, for ``duration_s`` or ``messages_max`` messages; latency per call.
- ``consume``: a queue prefilled with ``prefill`` messages is drained by ``concurrency``
  consumers of one group, each looping receive(batch) + ack; latency per receive+ack cycle.
- ``end_to_end``: publishers paced to ``rate`` messages/s (one message per call) while
  ``consumers`` of one group receive and ack; latency = delivered - sent, per message.
- ``fanout``: one queue, three groups; publishers paced to ``rate`` while every group consumes;
  throughput counts deliveries (3 per message), latency as in end_to_end.
- ``fanout_offsets``: the same on a stream read by three groups that keep only their position
  (no ack per message; ``api.OffsetReader``): FluxMQ's ``client.reader``, JetStream AckNone
  consumers. Adapters without ``read`` skip it.

All loops are bounded by time and by count. Client CPU (this process) and broker CPU (the
adapter's server processes) are recorded beside every number: on a 2-core machine the client
competes with the brokers.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Sequence

from bench.fluxmq_driver import RunResult, paced, tree_cpu_seconds
from bench.peers.api import Adapter, Delivered, OffsetReader

_STAMP = struct.Struct(">Q")
RECEIVE_WAIT_MS = 200
DRAIN_GRACE_S = 10.0  # after publishing stops, how long consumers may take to catch up
# Paced publishers of end_to_end and fanout (one message per call each): enough that every
# broker reaches the offered rate, so that latencies are compared at the same load.
E2E_PUBLISHERS = 8


def payload(size: int) -> bytes:
    """A message of ``size`` bytes whose first 8 are the send time."""
    return _STAMP.pack(time.perf_counter_ns()) + os.urandom(max(0, size - _STAMP.size))


def sent_at_ns(body: bytes) -> int:
    return int(_STAMP.unpack_from(body)[0])


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU of the broker processes ``pids`` and of the processes under them (a FluxMQ node's
    shard process; whatever helpers a peer runs)."""
    return sum(tree_cpu_seconds(pid) or 0.0 for pid in pids)


class _Meter:
    """Client and server CPU over a run."""

    def __init__(self, adapter: Adapter) -> None:
        self.pids = adapter.server_pids()
        self.client0 = time.process_time()
        self.server0 = cpu_seconds(self.pids)

    def apply(self, result: RunResult) -> RunResult:
        result.client_cpu_s = time.process_time() - self.client0
        result.server_cpu_s = cpu_seconds(self.pids) - self.server0
        return result


async def publish(
    adapter: Adapter,
    queue: str,
    *,
    size: int,
    batch: int,
    concurrency: int,
    duration_s: float,
    messages_max: int,
) -> RunResult:
    await adapter.publish(queue, [payload(size) for _ in range(batch)])  # warm-up
    latencies: list[float] = []
    sent = 0

    async def once() -> None:
        nonlocal sent
        bodies = [payload(size) for _ in range(batch)]
        t0 = time.perf_counter()
        await adapter.publish(queue, bodies)
        latencies.append((time.perf_counter() - t0) * 1000)
        sent += batch

    meter = _Meter(adapter)
    start = time.perf_counter()
    await paced(once, lambda: sent < messages_max, start, start + duration_s, None, concurrency)
    elapsed = time.perf_counter() - start
    return meter.apply(
        RunResult(
            "publish",
            sent,
            elapsed,
            latencies,
            params={"size": size, "batch": batch, "concurrency": concurrency},
        )
    )


async def consume(
    adapter: Adapter,
    queue: str,
    group: str,
    *,
    size: int,
    batch: int,
    concurrency: int,
    prefill: int,
    duration_s: float,
    filled: bool = False,
) -> RunResult:
    """``filled``: the queue already holds ``prefill`` messages (the caller published them)."""
    fill_batch = 100
    for at in range(0, 0 if filled else prefill, fill_batch):
        await adapter.publish(queue, [payload(size) for _ in range(min(fill_batch, prefill - at))])
    latencies: list[float] = []
    acked = 0

    async def once() -> None:
        nonlocal acked
        t0 = time.perf_counter()
        got = await adapter.receive(queue, group, batch, RECEIVE_WAIT_MS)
        await adapter.ack(queue, group, got)
        if got:
            latencies.append((time.perf_counter() - t0) * 1000)
        acked += len(got)

    meter = _Meter(adapter)
    start = time.perf_counter()
    await paced(once, lambda: acked < prefill, start, start + duration_s, None, concurrency)
    elapsed = time.perf_counter() - start
    return meter.apply(
        RunResult(
            "consume",
            acked,
            elapsed,
            latencies,
            params={"size": size, "batch": batch, "concurrency": concurrency},
            detail={"prefilled": prefill, "drained": acked >= prefill},
        )
    )


async def _paced_with_consumers(
    adapter: Adapter,
    queue: str,
    groups: Sequence[str],
    *,
    name: str,
    size: int,
    rate: float,
    duration_s: float,
    publishers: int,
    consumers_per_group: int,
    batch: int,
    reader: OffsetReader | None = None,
) -> RunResult:
    """``reader``: groups read with ``reader.read`` (no ack) instead of receive + ack."""
    latencies: list[float] = []
    published = 0
    delivered = 0
    done_publishing = False

    async def publish_once() -> None:
        nonlocal published
        await adapter.publish(queue, [payload(size)])
        published += 1

    async def take(group: str) -> list[bytes]:
        """What ``group`` got next, settled (acked) before it counts."""
        got: list[Delivered] = await adapter.receive(queue, group, batch, RECEIVE_WAIT_MS)
        now = time.perf_counter_ns()
        latencies.extend((now - sent_at_ns(m.payload)) / 1e6 for m in got)
        await adapter.ack(queue, group, got)
        return [m.payload for m in got]

    async def read(group: str) -> list[bytes]:
        assert reader is not None
        got = await reader.read(queue, group, batch, RECEIVE_WAIT_MS)
        now = time.perf_counter_ns()
        latencies.extend((now - sent_at_ns(m)) / 1e6 for m in got)
        return got

    receive = take if reader is None else read

    async def consumer(group: str) -> None:
        nonlocal delivered
        deadline = time.perf_counter() + duration_s + DRAIN_GRACE_S
        while time.perf_counter() < deadline:
            if done_publishing and delivered >= published * len(groups):
                return
            got = await receive(group)  # awaited first: ``delivered`` is shared by the tasks
            delivered += len(got)

    meter = _Meter(adapter)
    start = time.perf_counter()
    tasks = [asyncio.create_task(consumer(g)) for g in groups for _ in range(consumers_per_group)]
    await paced(
        publish_once, lambda: True, start, start + duration_s, publishers / rate, publishers
    )
    done_publishing = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    return meter.apply(
        RunResult(
            name,
            delivered,
            elapsed,
            latencies,
            params={"size": size, "rate": rate, "groups": len(groups), "batch": batch},
            detail={
                "published": published,
                "delivered": delivered,
                "complete": delivered == published * len(groups),
                # What the publishers achieved of ``rate``: latencies compare only at equal load.
                "published_per_s": round(published / duration_s),
            },
        )
    )


async def end_to_end(
    adapter: Adapter, queue: str, group: str, *, size: int, rate: float, duration_s: float
) -> RunResult:
    return await _paced_with_consumers(
        adapter,
        queue,
        [group],
        name="end_to_end",
        size=size,
        rate=rate,
        duration_s=duration_s,
        publishers=E2E_PUBLISHERS,
        consumers_per_group=2,
        batch=100,
    )


async def fanout(
    adapter: Adapter,
    queue: str,
    groups: Sequence[str],
    *,
    size: int,
    rate: float,
    duration_s: float,
    reader: OffsetReader | None = None,
) -> RunResult:
    """``reader``: the groups read by offsets (``fanout_offsets``) instead of receive + ack."""
    return await _paced_with_consumers(
        adapter,
        queue,
        groups,
        name="fanout" if reader is None else "fanout_offsets",
        size=size,
        rate=rate,
        duration_s=duration_s,
        publishers=E2E_PUBLISHERS,
        consumers_per_group=1,
        batch=100,
        reader=reader,
    )
