"""One node, several queues, 1 vs N shard processes: ``python -m bench.shard_processes``.

A fresh single node per run (``--shard-processes`` taken in turn, rounds interleaved so the
machine's drift hits every setting alike); ``--queues`` queues, queue i created in local shard
``local-(i mod N)`` so they spread evenly over the shard processes; ``--concurrency`` callers
in total, shared out over the queues, each a closed loop of Publish calls of ``--batch``
messages of ``--size`` bytes (bodies serialized once: the client stays light). Per run:
messages/s acknowledged, p50/p99 of a call, and the node's CPU (front end and shard processes).
Bounded by ``--duration`` and ``--messages-max`` per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from bench.fluxmq_driver import (
    FluxNode,
    RunResult,
    descendants,
    process_cpu_seconds,
    publish_workload,
)
from fluxmq._pb.v1 import queue_pb2 as pb

CREATE = "/fluxmq.v1.QueueService/CreateQueue"


async def create_queues(address: str, names: list[str], processes: int, partitions: int) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub_create = ch.unary_unary(
            CREATE,
            request_serializer=pb.CreateQueueRequest.SerializeToString,
            response_deserializer=pb.Queue.FromString,
        )
        for i, name in enumerate(names):
            config = pb.QueueConfig(name=name, partitions=partitions)
            if processes > 1:
                # Imported here: a run against an older tree (PYTHONPATH) has no siblings.
                from fluxmq.server.shard_process.siblings import local_shard_id

                config.replication.group = local_shard_id(i % processes)
            await stub_create(pb.CreateQueueRequest(config=config), timeout=10)


async def one_run(args: argparse.Namespace, processes: int, root: Path) -> dict[str, object]:
    node = FluxNode(
        root / f"sp{processes}-{time.monotonic_ns()}", "--shard-processes", str(processes)
    )
    node.start()
    try:
        names = [f"bench-{i}" for i in range(args.queues)]
        await create_queues(node.address, names, processes, args.partitions)
        per_queue = max(1, args.concurrency // args.queues)
        assert node.proc is not None
        pids = [node.proc.pid, *descendants(node.proc.pid)]
        by_process0 = [process_cpu_seconds(pid) or 0.0 for pid in pids]
        cpu0 = node.cpu_seconds()
        client0 = time.process_time()
        results: list[RunResult] = await asyncio.gather(
            *(
                publish_workload(
                    node.address,
                    name,
                    size=args.size,
                    batch=args.batch,
                    concurrency=per_queue,
                    duration_s=args.duration,
                    messages_max=args.messages_max // args.queues,
                )
                for name in names
            )
        )
        cpu = node.cpu_seconds() - cpu0
        client_cpu = time.process_time() - client0
        by_process = [
            (process_cpu_seconds(pid) or 0.0) - before
            for pid, before in zip(pids, by_process0, strict=True)
        ]
    finally:
        node.stop()
    sent = sum(r.messages for r in results)
    elapsed = max(r.seconds for r in results)
    latencies = sorted(x for r in results for x in r.latencies_ms)
    return {
        "shard_processes": processes,
        "msgs_per_s": sent / elapsed,
        "p50_ms": latencies[len(latencies) // 2] if latencies else 0.0,
        "p99_ms": latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        "node_cpu_s": cpu,
        "node_cpu_us_per_msg": cpu / sent * 1e6 if sent else 0.0,
        "messages": sent,
        "client_cpu_s": client_cpu,
        "seconds": elapsed,
        "cpu_by_process": f"{by_process[0]:.1f} / " + ", ".join(f"{x:.1f}" for x in by_process[1:]),
    }


def busy(row: dict[str, object]) -> float:
    """Node and client CPU over the run, as a share of every core of the machine."""
    cpu = float(row["node_cpu_s"]) + float(row["client_cpu_s"])  # type: ignore[arg-type]
    return cpu / (float(row["seconds"]) * (os.cpu_count() or 1))  # type: ignore[arg-type]


def table(rows: list[dict[str, object]], settings: list[int]) -> str:
    lines = [
        "| shard_processes | msg/s (median) | each round | p50 ms | p99 ms | node CPU us/msg "
        "| CPU s: front end / shard processes | client CPU s | machine busy |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    medians = {}
    for n in settings:
        mine = [r for r in rows if r["shard_processes"] == n]
        rates = [float(r["msgs_per_s"]) for r in mine]  # type: ignore[arg-type]
        medians[n] = statistics.median(rates)
        lines.append(
            f"| {n} | {medians[n]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates)} | "
            f"{statistics.median(float(r['p50_ms']) for r in mine):.1f} | "  # type: ignore[arg-type]
            f"{statistics.median(float(r['p99_ms']) for r in mine):.1f} | "  # type: ignore[arg-type]
            f"{statistics.median(float(r['node_cpu_us_per_msg']) for r in mine):.0f} | "  # type: ignore[arg-type]
            f"{mine[-1]['cpu_by_process']} | {float(mine[-1]['client_cpu_s']):.1f} | "  # type: ignore[arg-type]
            f"{busy(mine[-1]):.0%} |"
        )
    base = settings[0]
    for n in settings[1:]:
        lines.append(f"\n{n} vs {base} shard processes: {medians[n] / medians[base]:.2f}x")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    settings = [int(x) for x in args.processes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fluxmq-bench-sp-") as tmp:
        for round_ in range(args.rounds):
            order = settings if round_ % 2 == 0 else list(reversed(settings))
            for n in order:
                row = await one_run(args, n, Path(tmp))
                row["round"] = round_
                rows.append(row)
                print(json.dumps(row), flush=True)
    text = table(rows, settings)
    print(text)
    if args.out:
        body = json.dumps({"args": vars(args), "cpus": os.cpu_count(), "rows": rows}, indent=1)
        await asyncio.to_thread(Path(args.out).write_text, body)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shard_processes", description=__doc__)
    p.add_argument("--processes", default="1,2", help="shard_processes settings, in turn")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=16, help="callers in total")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--messages-max", type=int, default=5_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="", help="write the rows as JSON here")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
