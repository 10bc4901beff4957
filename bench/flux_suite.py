"""FluxMQ's own detailed suite: ``python -m bench flux`` (the comparison with its peers is
``python -m bench``, see bench/compare.py).

Single node, fsync on (the default: every acknowledged publish is fsync'd). Workloads:
- publish: 256-byte messages, batches of 100, 4 concurrent clients, closed loop, max rate;
- fetch: 4 concurrent readers drain what was published, 1000 records per Fetch;
- publish latency at half of the measured max rate (paced);
- lease_ack: a work queue (4 partitions, one shared group) filled with up to 200k messages is
  drained by 4 consumers, each looping Lease(100) + Ack(those receipts);
- consume_max / consume_latency: publishers and one Consume stream (max_in_flight 1000, each
  response acked as one Ack) at full speed, then publish -> delivered latency at half that rate;
- with ``--profile``: py-spy samples the broker during a publish, a fetch and a lease_ack run.
Then a 3-replica cluster (cluster mode, fresh data dirs, all on this machine; skip with
``--no-cluster``, or run only the publish rows and these with ``--cluster``):
- cluster_publish / cluster_publish@50%: the same publish workloads, sent to the leader;
- cluster_publish_via_follower: the same, sent to a follower (which forwards to the leader);
- cluster_failover: publishers paced to ``--failover-rate`` send to the leader, which gets
  kill -9; clients retry on the other nodes; reports kill -> first acknowledged publish;
- with ``--profile``: py-spy samples the leader (per thread) during a cluster publish run.
All clients run in this one process (asyncio gRPC), on the same machine as the broker(s).
Results: bench/results/<stamp>.json and .md; ``--write-results`` also rewrites bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.cluster import FluxCluster, failover_workload
from bench.fluxmq_driver import (
    FluxNode,
    RunResult,
    consume_workload,
    create_group,
    create_queue,
    fetch_workload,
    lease_ack_workload,
    publish_workload,
)

HERE = Path(__file__).resolve().parent
PARTITIONS = 4
GROUP = "workers"
CLIENT_PROCESSES = 1  # the bench process itself: every client is a coroutine in it
# Goals of the consumer-group issue, checked (not tuned for) in the generated notes.
LEASE_ACK_GOAL_MSG_S = 100_000
CONSUME_P99_GOAL_MS = 20.0
# Goals of the cluster issue: 3 nodes on this machine, the default publish workload.
CLUSTER_PUBLISH_GOAL_MSG_S = 60_000
CLUSTER_P99_GOAL_MS = 25.0


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
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        # Other work on the machine skews every number: the 1-minute load average before the run.
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def fsync_latency_ms(directory: Path, n: int = 50) -> tuple[float, float]:
    """(median, max) ms of a 4 KiB write + fsync of a file in ``directory``: the disk the
    brokers' journals and stores are on."""
    path = directory / "fsync-probe"
    xs = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
            t0 = time.perf_counter()
            os.fsync(fd)
            xs.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    xs.sort()
    return xs[len(xs) // 2], xs[-1]


# Where a sample of the cluster leader goes: the first rule matching its stack (frames joined by
# ";", the leaf last) names it. Leaf line numbers are those of pysyncobj 0.3.x's tcp_connection.
PROFILE_CATEGORIES: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("raft journal: append + fdatasync (SegmentFileJournal._write)",
     lambda st, _: "SegmentFileJournal._write" in st),
    ("apply to state: apply_batch, LMDB commit + fsync", lambda st, _: "apply_batch" in st),
    ("encryption (cryptography/Fernet)", lambda st, _: "cryptography" in st or "fernet" in st),
    ("pickle (pysyncobj messages)", lambda _, leaf: "pickle" in leaf),
    ("zlib (pysyncobj messages)", lambda _, leaf: "tcp_connection.py:144" in leaf
     or "tcp_connection.py:291" in leaf),
    ("raft transport: sockets, poll, parsing", lambda st, _: "pysyncobj/" in st),
    ("raft shard/driver (frames, bookkeeping)", lambda st, _: "raft/" in st),
    ("event loop: gRPC handlers, proposals, responses", lambda st, _: "MainThread" in st),
)  # fmt: skip


def categorize(raw: Path, seconds: int, rate: int) -> str:
    """Per thread: the share of wall time it was sampled busy (py-spy without --idle: on a CPU
    or in a blocking call such as fsync), and that time by category (PROFILE_CATEGORIES)."""
    threads: dict[str, int] = {}
    cats: dict[tuple[str, str], int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        thread = stack.split(";", 1)[0].split(":", 1)[-1].strip()
        leaf = stack.rsplit(";", 1)[-1]
        cat = next((c for c, match in PROFILE_CATEGORIES if match(stack, leaf)), "other")
        threads[thread] = threads.get(thread, 0) + n
        cats[(thread, cat)] = cats.get((thread, cat), 0) + n
    possible = seconds * rate
    out = []
    for thread, n in sorted(threads.items(), key=lambda kv: -kv[1]):
        out.append(f"{100 * n / possible:5.1f}% of wall time busy: thread {thread}")
        for (t, cat), m in sorted(cats.items(), key=lambda kv: -kv[1]):
            if t == thread and 100 * m / possible >= 0.5:
                out.append(f"    {100 * m / possible:5.1f}%  {cat}")
    return "\n".join(out)


def profile(node: FluxNode, seconds: int, out: Path, *, threads: bool = False) -> str:
    """Sample the broker with py-spy; returns the top functions by own time (text); with
    ``threads``, first the busy time of each thread by category (``categorize``)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    assert node.proc is not None
    raw = out.with_suffix(".txt")
    rate = 200
    subprocess.run(
        [spy, "record", "--pid", str(node.proc.pid), "--duration", str(seconds), "--rate",
         str(rate), "--format", "raw", "--output", str(raw), "--nonblocking",
         *(["--threads"] if threads else [])],
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
        if threads:
            leaf = f"[{stack.split(';', 1)[0].split(':', 1)[-1].strip()}] {leaf}"
        own[leaf] = own.get(leaf, 0) + n
    top = sorted(own.items(), key=lambda kv: -kv[1])[:15]
    text = "\n".join(f"{100 * n / total:5.1f}%  {name}" for name, n in top)
    if threads:
        text = (
            categorize(raw, seconds, rate)
            + "\n\nTop own-time frames (share of all samples, [thread]):\n"
            + text
        )
    return text


async def profiled(
    node: FluxNode,
    seconds: int,
    out: Path,
    work: asyncio.Future[RunResult],
    *,
    threads: bool = False,
) -> str:
    text = await asyncio.to_thread(profile, node, seconds, out, threads=threads)
    await work
    return text


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{round(v):,}" if v >= 1000 else f"{v:g}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def goals(results: list[RunResult]) -> list[str]:
    by = {r.workload: r for r in results}
    out = []
    if "lease_ack" in by:
        r = by["lease_ack"]
        met = "met" if r.rate >= LEASE_ACK_GOAL_MSG_S else "NOT met"
        out.append(
            f"lease_ack: {round(r.rate):,} msg/s acked (goal >= {LEASE_ACK_GOAL_MSG_S:,}: {met})"
        )
    if "consume_latency" in by:
        r = by["consume_latency"]
        p99 = r.percentile(0.99)
        met = "met" if p99 <= CONSUME_P99_GOAL_MS else "NOT met"
        out.append(
            f"consume_latency: publish -> delivered p50 {r.percentile(0.5):.1f} ms, "
            f"p95 {r.percentile(0.95):.1f} ms, p99 {p99:.1f} ms at "
            f"{round(r.rate):,} msg/s (goal p99 <= {CONSUME_P99_GOAL_MS:g} ms at half the max "
            f"rate: {met})"
        )
    if "cluster_publish" in by:
        r = by["cluster_publish"]
        met = "met" if r.rate >= CLUSTER_PUBLISH_GOAL_MSG_S else "NOT met"
        single = f"{round(by['publish'].rate):,}" if "publish" in by else "-"
        out.append(
            f"cluster_publish: {round(r.rate):,} msg/s through the leader of 3 replicas, "
            f"single node {single} msg/s in the same run (goal >= "
            f"{CLUSTER_PUBLISH_GOAL_MSG_S:,}: {met}); the 3 brokers and the client used "
            f"{100 * (r.server_cpu_s + r.client_cpu_s) / ((os.cpu_count() or 1) * r.seconds):.0f}%"
            f" of the machine's {os.cpu_count()} cores (CPU s / (cores x seconds))"
        )
    if "cluster_publish@50%" in by:
        r = by["cluster_publish@50%"]
        p99 = r.percentile(0.99)
        met = "met" if p99 <= CLUSTER_P99_GOAL_MS else "NOT met"
        out.append(
            f"cluster_publish@50%: publish p50 {r.percentile(0.5):.1f} ms, p99 {p99:.1f} ms at "
            f"{round(r.rate):,} msg/s, half the measured cluster max (goal p99 <= "
            f"{CLUSTER_P99_GOAL_MS:g} ms at half the rate: {met}; the goal's half rate, "
            f"{CLUSTER_PUBLISH_GOAL_MSG_S // 2:,} msg/s, is "
            + ("above" if r.rate * 2 < CLUSTER_PUBLISH_GOAL_MSG_S // 2 else "within")
            + " the measured cluster max)"
        )
    if "cluster_failover" in by:
        r = by["cluster_failover"]
        out.append(
            f"cluster_failover: kill -9 of the leader -> first acknowledged publish "
            f"{r.detail.get('failover_s')} s (publishers paced to {_fmt(r.params.get('rate_max'))} "
            "msg/s, retrying on the other nodes)"
        )
    return out


def markdown(results: list[RunResult], info: dict[str, object], profiles: dict[str, str]) -> str:
    base = next((r.rate for r in results if r.workload == "publish"), 0.0)
    lines = [
        "| workload | msg/s | x publish | p50 ms | p95 ms | p99 ms | p99.9 ms | client CPU s "
        "| broker CPU s | params |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        d = r.as_dict()
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items() if v is not None)
        ratio = f"{r.rate / base:.2f}" if base else "-"
        lines.append(
            f"| {r.workload} | {d['msg_per_s']:,} | {ratio} | {d['p50_ms']} | {d['p95_ms']} | "
            f"{d['p99_ms']} | {d['p999_ms']} | {d['client_cpu_s']} | {d['server_cpu_s']} | "
            f"{params} |"
        )
    text = "\n".join(lines)
    text += (
        "\n\nLatency columns: publish = one Publish call; fetch = one Fetch call; lease_ack = one "
        "Lease + Ack round (per-call percentiles below); consume_* = publish -> delivered on the "
        "Consume stream, per message (consume_max is saturated, so its backlog is in it). "
        "x publish = msg/s relative to the publish row of the same run.\n"
    )
    details = [r for r in results if r.detail]
    if details:
        text += "\nDetails:\n\n"
        for r in details:
            text += (
                f"- {r.workload}: "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in r.detail.items())
                + "\n"
            )
    g = goals(results)
    if g:
        text += "\nIssue goals:\n\n" + "".join(f"- {line}\n" for line in g)
    text += (
        f"\nClients: {CLIENT_PROCESSES} client process (the bench itself; asyncio gRPC, one "
        "channel per workload), sharing the cores with the broker.\n"
    )
    if any(r.workload.startswith("cluster_") for r in results):
        text += (
            "\nCluster rows: 3 replicas (3 `fluxmq serve` processes in cluster mode, Raft on "
            "loopback, static peers without etcd, so client authentication off: "
            "`python -m bench.auth_overhead` measures its cost; each with its own data dir on "
            "the same disk) run on this machine, "
            f"sharing its {os.cpu_count()} cores with each other and with the client process; "
            "the single-node rows ran first, alone. Broker CPU s of a cluster row is the sum "
            "over the 3 processes (per node in the details: cpu_leader_s, cpu_follower1_s = the "
            "follower that cluster_publish_via_follower sends to, cpu_follower2_s; the leader "
            "of cluster_failover until its kill). cluster_failover's "
            "latency columns are per publish, retries included.\n"
        )
    text += "\nMachine: " + ", ".join(f"{k} {v}" for k, v in info.items()) + "\n"
    for name, top in profiles.items():
        if name.startswith("cluster_"):
            text += (
                f"\nWhere the time goes on the leader during {name} (py-spy, per thread):"
                f"\n\n```\n{top}\n```\n"
            )
        else:
            text += (
                f"\nTop own-time frames of the broker during {name} (py-spy):\n\n```\n{top}\n```\n"
            )
    return text


async def run_cluster(
    args: argparse.Namespace,
    root: Path,
    results: list[RunResult],
    profiles: dict[str, str],
    prefix: Path,
) -> None:
    """The cluster rows: a fresh 3-replica cluster, the queue created through the leader."""
    cluster = FluxCluster(root)
    cluster.start()
    try:
        leader = await cluster.wait_leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        other = next(n for n in cluster.nodes if n is not leader and n is not follower)
        await create_queue(leader.address, "bench", PARTITIONS)

        async def measured(name: str, coro: Awaitable[RunResult]) -> RunResult:
            await cluster.wait_converged(10)  # start with the followers caught up
            cpu0 = [n.cpu_seconds() for n in (leader, follower, other)]
            res = await coro
            cpu = [
                n.cpu_seconds() - c for n, c in zip((leader, follower, other), cpu0, strict=True)
            ]
            res.workload = name
            res.server_cpu_s = sum(cpu)
            # follower1 is the follower that cluster_publish_via_follower sends to.
            res.detail = {
                "cpu_leader_s": round(cpu[0], 2),
                "cpu_follower1_s": round(cpu[1], 2),
                "cpu_follower2_s": round(cpu[2], 2),
                **res.detail,
            }
            results.append(res)
            print(json.dumps(res.as_dict()), flush=True)
            return res

        common = {"size": args.size, "batch": args.batch, "concurrency": args.concurrency}
        bounds = {"duration_s": args.duration, "messages_max": args.messages_max}
        peak = await measured(
            "cluster_publish", publish_workload(leader.address, "bench", **bounds, **common)
        )
        await measured(
            "cluster_publish@50%",
            publish_workload(leader.address, "bench", rate_max=peak.rate / 2, **bounds, **common),
        )
        await measured(
            "cluster_publish_via_follower",
            publish_workload(follower.address, "bench", **bounds, **common),
        )
        if args.profile:
            secs = max(3, int(args.duration))
            work = asyncio.ensure_future(
                publish_workload(
                    leader.address, "bench", duration_s=secs + 2,
                    messages_max=args.messages_max, **common,
                )
            )  # fmt: skip
            profiles["cluster_publish"] = await profiled(
                leader, secs, Path(f"{prefix}-profile-cluster_publish"), work, threads=True
            )
        await measured(
            "cluster_failover",
            failover_workload(
                cluster, "bench", rate=args.failover_rate,
                before_s=min(3.0, max(1.0, args.duration / 3)),
                after_s=min(2.0, max(1.0, args.duration / 5)), **common,
            ),
        )  # fmt: skip
    except BaseException:
        for i, node in enumerate(cluster.nodes):
            print(f"-- log of cluster node {i} --\n{node.log_tail()}", file=sys.stderr)
        raise
    finally:
        cluster.stop()


async def run_suite(args: argparse.Namespace, out_dir: Path) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[RunResult] = []
    profiles: dict[str, str] = {}
    info = machine()
    with tempfile.TemporaryDirectory(prefix="fluxmq-bench-") as tmp:
        fsync = fsync_latency_ms(Path(tmp))
        node = FluxNode(Path(tmp) / "node")
        node.start()
        try:
            await create_queue(node.address, "bench", PARTITIONS)

            async def measured(coro: Awaitable[RunResult]) -> RunResult:
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
            if not args.cluster:
                await measured(
                    fetch_workload(
                        node.address, "bench", PARTITIONS, batch=1000,
                        concurrency=args.concurrency, messages_max=args.messages_max,
                    )
                )  # fmt: skip
            await measured(
                publish_workload(
                    node.address, "bench", duration_s=args.duration,
                    messages_max=args.messages_max, rate_max=peak.rate / 2, **common,
                )
            )  # fmt: skip
            results[-1].workload = "publish@50%"
            secs = max(3, int(args.duration))
            if args.profile:
                # publish and fetch first: the broker in the same state as without groups.
                for name, coro in (
                    ("publish", publish_workload(
                        node.address, "bench", duration_s=secs + 2,
                        messages_max=args.messages_max, **common)),
                    ("fetch", fetch_workload(
                        node.address, "bench", PARTITIONS, batch=1000,
                        concurrency=args.concurrency, messages_max=args.messages_max)),
                ):  # fmt: skip
                    if args.cluster and name != "publish":
                        coro.close()
                        continue
                    work = asyncio.ensure_future(coro)
                    profiles[name] = await profiled(
                        node, secs, out_dir / f"{stamp}-profile-{name}", work
                    )

            if not args.cluster:
                # -- consumer groups --
                batch_size = {"size": args.size, "batch": args.batch}
                lease_n = min(args.messages_max, args.lease_messages)

                async def fill_work_queue(name: str) -> tuple[RunResult, int]:
                    """A work queue with a shared group, filled (bounded by count and time)."""
                    await create_queue(node.address, name, PARTITIONS, work=True)
                    await create_group(node.address, name, GROUP)
                    fill = await publish_workload(
                        node.address, name, duration_s=args.group_time, messages_max=lease_n,
                        concurrency=args.concurrency, **batch_size,
                    )  # fmt: skip
                    return fill, fill.messages + args.batch  # + the warm-up batch

                fill, expected = await fill_work_queue("bench-work")
                res = await measured(
                    lease_ack_workload(
                        node.address, "bench-work", GROUP, batch=args.lease_batch,
                        concurrency=args.concurrency, duration_s=args.group_time, expected=expected,
                    )
                )  # fmt: skip
                res.detail = {"fill_msg_per_s": round(fill.rate), **res.detail}
                lease_rate = res.rate

                e2e = {"max_in_flight": args.max_in_flight, "concurrency": args.concurrency}
                await create_queue(node.address, "bench-e2e-max", PARTITIONS, work=True)
                await create_group(node.address, "bench-e2e-max", GROUP)
                e2e_peak = await measured(
                    consume_workload(
                        node.address, "bench-e2e-max", GROUP, duration_s=min(5.0, args.duration),
                        messages_max=args.messages_max, drain_s=5.0, **batch_size, **e2e,
                    )
                )  # fmt: skip
                e2e_peak.workload = "consume_max"
                await create_queue(node.address, "bench-e2e", PARTITIONS, work=True)
                await create_group(node.address, "bench-e2e", GROUP)
                await measured(
                    consume_workload(
                        node.address, "bench-e2e", GROUP, duration_s=args.duration,
                        messages_max=args.messages_max, rate_max=e2e_peak.rate / 2, drain_s=5.0,
                        **batch_size, **e2e,
                    )
                )  # fmt: skip

                if args.profile:
                    # lease_ack: fill a fresh queue (not sampled), then sample most of the drain.
                    _, expected = await fill_work_queue("bench-work-profile")
                    lease_secs = max(2, min(secs, int(0.8 * expected / max(lease_rate, 1.0))))
                    work = asyncio.ensure_future(
                        lease_ack_workload(
                            node.address, "bench-work-profile", GROUP, batch=args.lease_batch,
                            concurrency=args.concurrency, duration_s=args.group_time,
                            expected=expected,
                        )
                    )  # fmt: skip
                    profiles["lease_ack"] = await profiled(
                        node, lease_secs, out_dir / f"{stamp}-profile-lease_ack", work
                    )
        except BaseException:
            print(f"-- log of the node --\n{node.log_tail()}", file=sys.stderr)
            raise
        finally:
            node.stop()
        if not args.no_cluster:
            await run_cluster(args, Path(tmp) / "cluster", results, profiles, out_dir / stamp)
    info["fsync_4k_ms"] = f"median {fsync[0]:.2f}, max {fsync[1]:.2f}"
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
            f"{head}{marker}\nRun {stamp} (`python -m bench {' '.join(sys.argv[1:])}`):\n\n{md}"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench flux", description=__doc__)
    p.add_argument("--size", type=int, default=256, help="message bytes")
    p.add_argument("--batch", type=int, default=100, help="messages per Publish")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent clients")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per publish run")
    p.add_argument("--messages-max", type=int, default=5_000_000, help="bound per run")
    p.add_argument(
        "--lease-messages", type=int, default=200_000, help="messages drained by lease_ack"
    )
    p.add_argument("--lease-batch", type=int, default=100, help="max_messages per Lease")
    p.add_argument(
        "--group-time", type=float, default=25.0,
        help="time bound (s) of the lease_ack fill and, separately, of its drain",
    )  # fmt: skip
    p.add_argument("--max-in-flight", type=int, default=1000, help="of the Consume stream")
    p.add_argument("--profile", action="store_true", help="py-spy the broker")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--cluster", action="store_true",
        help="only the single-node publish rows and the 3-node cluster rows",
    )  # fmt: skip
    which.add_argument("--no-cluster", action="store_true", help="skip the 3-node cluster rows")
    p.add_argument(
        "--failover-rate", type=float, default=5000.0,
        help="msg/s of the publishers during cluster_failover",
    )  # fmt: skip
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--write-results", action="store_true", help="rewrite bench/RESULTS.md")
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(run_suite(args, out_dir))


if __name__ == "__main__":
    raise SystemExit(main())
