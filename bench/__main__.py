"""FluxMQ benchmark suite: ``python -m bench`` (or ``make bench``).

Single node, fsync on (the default: every acknowledged publish is fsync'd). Workloads:
- publish: 256-byte messages, batches of 100, 4 concurrent clients, closed loop, max rate;
- fetch: 4 concurrent readers drain what was published, 1000 records per Fetch;
- publish latency at half of the measured max rate (paced);
- with ``--profile``: py-spy samples the broker during a publish and a fetch run.
Results: bench/results/<stamp>.json and .md; ``--write-results`` also rewrites bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fluxmq_driver import (
    FluxNode,
    RunResult,
    create_queue,
    fetch_workload,
    publish_workload,
)

HERE = Path(__file__).resolve().parent
PARTITIONS = 4


def machine() -> dict[str, object]:
    import grpc
    import lmdb

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "lmdb": lmdb.version(),
        "cpu": cpu,
        "cores": __import__("os").cpu_count(),
        "kernel": platform.release(),
    }


def profile(node: FluxNode, seconds: int, out: Path) -> str:
    """Sample the broker with py-spy; returns the top functions by own time (text)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    assert node.proc is not None
    raw = out.with_suffix(".txt")
    subprocess.run(
        [spy, "record", "--pid", str(node.proc.pid), "--duration", str(seconds), "--rate", "200",
         "--format", "raw", "--output", str(raw), "--nonblocking"],
        check=True, capture_output=True, timeout=seconds + 60,
    )  # fmt: skip
    subprocess.run(
        [spy, "record", "--pid", str(node.proc.pid), "--duration", "1", "--format", "flamegraph",
         "--output", str(out.with_suffix(".svg")), "--nonblocking"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        leaf = stack.split(";")[-1]
        own[leaf] = own.get(leaf, 0) + n
    top = sorted(own.items(), key=lambda kv: -kv[1])[:15]
    return "\n".join(f"{100 * n / total:5.1f}%  {name}" for name, n in top)


async def profiled(node: FluxNode, seconds: int, out: Path, work: asyncio.Future[RunResult]) -> str:
    text = await asyncio.to_thread(profile, node, seconds, out)
    await work
    return text


def markdown(results: list[RunResult], info: dict[str, object], profiles: dict[str, str]) -> str:
    lines = [
        "| workload | msg/s | p50 ms | p99 ms | p99.9 ms | client CPU s | broker CPU s | params |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        d = r.as_dict()
        params = ", ".join(f"{k}={v}" for k, v in r.params.items() if v is not None)
        lines.append(
            f"| {r.workload} | {d['msg_per_s']:,} | {d['p50_ms']} | {d['p99_ms']} | "
            f"{d['p999_ms']} | {d['client_cpu_s']} | {d['server_cpu_s']} | {params} |"
        )
    text = "\n".join(lines)
    text += "\n\nMachine: " + ", ".join(f"{k} {v}" for k, v in info.items()) + "\n"
    for name, top in profiles.items():
        text += f"\nTop own-time frames of the broker during {name} (py-spy):\n\n```\n{top}\n```\n"
    return text


async def run_suite(args: argparse.Namespace, out_dir: Path) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[RunResult] = []
    profiles: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fluxmq-bench-") as tmp:
        node = FluxNode(Path(tmp) / "node")
        node.start()
        try:
            await create_queue(node.address, "bench", PARTITIONS)

            async def measured(coro):  # type: ignore[no-untyped-def]
                cpu0 = node.cpu_seconds()
                res = await coro
                res.server_cpu_s = node.cpu_seconds() - cpu0
                results.append(res)
                print(json.dumps(res.as_dict()), flush=True)
                return res

            common = {"size": args.size, "batch": args.batch, "concurrency": args.concurrency}
            peak = await measured(
                publish_workload(
                    node.address, "bench", duration_s=args.duration,
                    messages_max=args.messages_max, **common,
                )
            )  # fmt: skip
            await measured(
                fetch_workload(
                    node.address, "bench", PARTITIONS, batch=1000, concurrency=args.concurrency,
                    messages_max=args.messages_max,
                )
            )  # fmt: skip
            await measured(
                publish_workload(
                    node.address, "bench", duration_s=args.duration,
                    messages_max=args.messages_max, rate_max=peak.rate / 2, **common,
                )
            )  # fmt: skip
            results[-1].workload = "publish@50%"
            if args.profile:
                secs = max(3, int(args.duration))
                for name, coro in (
                    ("publish", publish_workload(
                        node.address, "bench", duration_s=secs + 2,
                        messages_max=args.messages_max, **common)),
                    ("fetch", fetch_workload(
                        node.address, "bench", PARTITIONS, batch=1000,
                        concurrency=args.concurrency, messages_max=args.messages_max)),
                ):  # fmt: skip
                    work = asyncio.ensure_future(coro)
                    profiles[name] = await profiled(
                        node, secs, out_dir / f"{stamp}-profile-{name}", work
                    )
        finally:
            node.stop()
    info = machine()
    (out_dir / f"{stamp}.json").write_text(
        json.dumps({"machine": info, "results": [r.as_dict() for r in results]}, indent=2)
    )
    md = markdown(results, info, profiles)
    (out_dir / f"{stamp}.md").write_text(md)
    print(md)
    if args.write_results:
        body = (HERE / "RESULTS.md").read_text() if (HERE / "RESULTS.md").exists() else ""
        marker = "<!-- generated -->"
        head = body.split(marker)[0] if marker in body else "# Benchmark results\n\n"
        (HERE / "RESULTS.md").write_text(
            f"{head}{marker}\nRun {stamp} (`python -m bench --profile --write-results`):\n\n{md}"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--size", type=int, default=256, help="message bytes")
    p.add_argument("--batch", type=int, default=100, help="messages per Publish")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent clients")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per publish run")
    p.add_argument("--messages-max", type=int, default=5_000_000, help="bound per run")
    p.add_argument("--profile", action="store_true", help="py-spy the broker")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--write-results", action="store_true", help="rewrite bench/RESULTS.md")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(run_suite(args, out_dir))


if __name__ == "__main__":
    raise SystemExit(main())
