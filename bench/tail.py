"""``client.tail()`` against raw Fetch (issue 38's target: >= 0.8x), 1 node and 3 nodes, same
run.

A stream queue of 4 partitions is filled once with ``--messages`` 256-byte messages; then,
alternating ``--rounds`` times: raw = ``bench.fluxmq_driver.fetch_workload`` (4 readers, one per
partition, Fetch of ``--batch`` records from offset 0 to the end, stored batches decoded in the
client as the SDK does), SDK = ``AsyncClient.tail(queue)`` from earliest, every partition merged,
counting records until all ``--messages`` were handed out. Both are timed from the first request
to the last record. On 3 nodes both read through the leader (the address the client is given
first). A ratio is SDK msg/s over raw msg/s, summed over rounds.

    python -m bench.tail [--messages 200000] [--rounds 2] [--nodes 1,3] [--write-results]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cluster import FluxCluster
from bench.fluxmq_driver import FluxNode, create_queue, fetch_workload
from fluxmq.client import AsyncClient

PARTITIONS = 4
RESULTS = Path(__file__).parent / "RESULTS.md"
SECTION = "## Issue 38: client.tail() against raw Fetch"


@dataclass
class Run:
    nodes: int
    name: str
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def fill(address: str, queue: str, n: int, size: int) -> None:
    await create_queue(address, queue, PARTITIONS)
    async with AsyncClient(address, codec="bytes") as client:
        value = os.urandom(size)
        for i in range(0, n, 10_000):
            await client.publish_batch(queue, [value] * min(10_000, n - i))


async def raw_fetch(nodes: int, address: str, queue: str, n: int, batch: int) -> Run:
    r = await fetch_workload(
        address, queue, PARTITIONS, batch=batch, concurrency=PARTITIONS, messages_max=n
    )
    return Run(nodes, "raw Fetch", r.messages, r.seconds)


async def sdk_tail(nodes: int, address: str, queue: str, n: int, batch: int) -> Run:
    async with AsyncClient(address, codec="bytes") as client:
        t0 = time.perf_counter()
        got = 0
        async with client.tail(queue, batch_max=min(batch, 500)) as tail:
            async for _ in tail:
                got += 1
                if got == n:
                    break
        return Run(nodes, "client.tail()", got, time.perf_counter() - t0)


def ratio(runs: list[Run], nodes: int) -> float:
    sdk = sum(r.messages for r in runs if r.nodes == nodes and r.name != "raw Fetch")
    sdk_s = sum(r.seconds for r in runs if r.nodes == nodes and r.name != "raw Fetch")
    raw = sum(r.messages for r in runs if r.nodes == nodes and r.name == "raw Fetch")
    raw_s = sum(r.seconds for r in runs if r.nodes == nodes and r.name == "raw Fetch")
    return (sdk / sdk_s) / (raw / raw_s) if sdk_s and raw_s and raw else 0.0


def markdown(args: argparse.Namespace, runs: list[Run], node_counts: list[int]) -> str:
    lines = [
        SECTION,
        "",
        f"`python -m bench.tail --messages {args.messages} --rounds {args.rounds} --nodes "
        f"{','.join(map(str, node_counts))}` ({time.strftime('%Y-%m-%d')}; 2 cores shared by "
        "the nodes and the client): a stream queue of 4 partitions, 256-byte messages, read "
        "whole. Raw: 4 Fetch readers (stored batches decoded in the client); SDK: one "
        "`client.tail(queue)` from earliest, partitions merged.",
        "",
        "| nodes | reader | messages | seconds | msg/s |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(f"| {r.nodes} | {r.name} | {r.messages} | {r.seconds:.2f} | {r.rate:,.0f} |")
    lines.append("")
    for n in node_counts:
        lines.append(f"- {n} node(s): tail / raw Fetch = **{ratio(runs, n):.2f}** (goal >= 0.8)")
    lines.append("")
    return "\n".join(lines)


def write_results(md: str) -> None:
    text = RESULTS.read_text()
    start = text.find(SECTION)
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + md + (text[end + 1 :] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + md
    RESULTS.write_text(text)


async def run(args: argparse.Namespace) -> int:
    node_counts = [int(x) for x in args.nodes.split(",")]
    runs: list[Run] = []
    for count in node_counts:
        root = Path(tempfile.mkdtemp(prefix=f"fluxmq-bench-tail-{count}-"))
        cluster = FluxCluster(root, count) if count > 1 else None
        node = FluxNode(root / "node") if cluster is None else None
        try:
            if cluster is not None:
                cluster.start()
                address = (await cluster.wait_leader()).address
            else:
                assert node is not None
                node.start()
                address = node.address
            await fill(address, "tailed", args.messages, 256)
            if cluster is not None:
                await cluster.wait_converged()
            for _ in range(args.rounds):
                for bench in (raw_fetch, sdk_tail):
                    r = await bench(count, address, "tailed", args.messages, args.batch)
                    runs.append(r)
                    print(f"{count} node(s) {r.name}: {r.rate:,.0f} msg/s", flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
            if node is not None:
                node.stop()
            shutil.rmtree(root, ignore_errors=True)
    md = markdown(args, runs, node_counts)
    print()
    print(md)
    if args.write_results:
        write_results(md)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tail", description=__doc__)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=500, help="records per Fetch / Tail message")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--nodes", default="1,3", help="comma-separated node counts (1,3)")
    p.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
