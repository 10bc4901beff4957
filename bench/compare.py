"""FluxMQ side by side with RabbitMQ quorum queues and NATS JetStream: ``python -m bench``.

For each broker (``--brokers``) and cluster size (``--nodes``), a fresh cluster on loopback runs
the same workloads (``bench.peers.workloads``) through its adapter (``bench.peers``):

- ``publish``: one message per call at each ``--concurrency``, and batches of ``--batch``
  messages per call (FluxMQ's Publish of many messages; for the peers that many publishes in
  flight, every confirm awaited);
- ``consume``: a prefilled queue drained by receive(batch) + ack;
- ``end_to_end``: publish -> delivered latency at ``--e2e-rate`` msg/s (the same offered load
  for every broker);
- ``fanout``: one queue, three groups, at ``--e2e-rate`` msg/s.
- ``fanout_offsets``: a stream read by three groups that keep only their position (no ack per
  message), at ``--e2e-rate`` msg/s; brokers whose adapter has no ``read`` skip it.

Durability is the same promise everywhere (see each adapter's ``durability``): a publish returns
when the broker has it fsync'd (on a majority for 3 nodes). Outputs in ``--out``
(bench/results): compare-<stamp>.json, .md, -throughput.png, -latency.png; ``--write-results``
replaces the ``peers`` section of bench/RESULTS.md. Every cluster is stopped before the next
starts, and at exit none of the processes is left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.fluxmq_driver import RunResult
from bench.peers import workloads
from bench.peers.api import Adapter, Cluster, OffsetReader
from bench.results_md import write_section

HERE = Path(__file__).resolve().parent
QUEUE_COUNTER = iter(range(1_000_000))
BROKERS = ("fluxmq", "fluxmq-raw", "rabbitmq", "nats")
GOAL_RABBIT_RATIO = 2.0  # FluxMQ 3-node publish >= 2x RabbitMQ quorum queues
GOAL_NATS_RATIO = 1.0  # ... and >= 1x NATS JetStream R3


def make_cluster(broker: str, root: Path, nodes: int) -> Cluster:
    if broker in ("fluxmq", "fluxmq-raw"):
        from bench.peers.fluxmq import FluxPeerCluster

        return FluxPeerCluster(root, nodes, sdk=broker == "fluxmq")
    if broker == "rabbitmq":
        from bench.peers.rabbitmq import RabbitCluster, install

        install()
        return RabbitCluster(root, nodes)  # type: ignore[return-value]
    if broker == "nats":
        from bench.peers.nats import NatsCluster

        return NatsCluster(root, nodes)  # type: ignore[return-value]
    raise ValueError(broker)


def _queue(prefix: str) -> str:
    return f"{prefix}-{next(QUEUE_COUNTER)}"


async def profile_fluxmq(
    cluster: Cluster, adapter: Adapter, args: argparse.Namespace, stamp: str
) -> dict[str, str]:
    """py-spy on the FluxMQ leader (per thread) while it serves a publish run (batch API) and a
    consume run; flame graphs and raw samples go to ``--out``. -> name: top costs (text)."""
    from bench.flux_suite import profile
    from bench.peers.fluxmq import FluxPeerCluster

    assert isinstance(cluster, FluxPeerCluster)
    out = Path(args.out)
    seconds = max(2, int(args.duration))
    texts: dict[str, str] = {}
    await adapter.connect()
    try:
        q = _queue("profile-pub")
        await adapter.create_queue(q, ["g"])
        name = f"compare-{stamp}-profile-publish-x{cluster.nodes}"
        spy = asyncio.create_task(
            asyncio.to_thread(profile, cluster.leader_node(), seconds, out / name, threads=True)
        )
        await workloads.publish(
            adapter,
            q,
            size=args.size,
            batch=args.batch,
            concurrency=4,
            duration_s=seconds + 1,
            messages_max=args.messages_max,
        )
        texts[f"publish, batches of {args.batch}, 4 clients ({name}.svg)"] = await spy
        q = _queue("profile-consume")
        await adapter.create_queue(q, ["g"])
        prefill = args.consume_prefill * 2
        for _ in range(0, prefill, 100):
            await adapter.publish(q, [workloads.payload(args.size) for _ in range(100)])
        name = f"compare-{stamp}-profile-consume-x{cluster.nodes}"
        spy = asyncio.create_task(
            asyncio.to_thread(profile, cluster.leader_node(), seconds, out / name, threads=True)
        )
        await workloads.consume(
            adapter,
            q,
            "g",
            size=args.size,
            batch=args.consume_batch,
            concurrency=args.consume_concurrency,
            prefill=prefill,
            duration_s=seconds + 1,
            filled=True,
        )
        texts[f"consume, receive {args.consume_batch} + ack, 4 consumers ({name}.svg)"] = await spy
    finally:
        await adapter.close()
    return texts


async def run_workloads(
    adapter: Adapter, args: argparse.Namespace, on_result: Callable[[RunResult], None]
) -> None:
    await adapter.connect()
    try:
        # One message per call (what a plain client does), and batches: FluxMQ's Publish of
        # many messages, RabbitMQ's confirms of that many messages in flight on one channel,
        # NATS's that many async PubAcks in flight.
        batches = [1, args.batch]
        for batch in batches:
            for concurrency in args.concurrency:
                q = _queue("pub")
                await adapter.create_queue(q, ["g"])
                on_result(
                    await workloads.publish(
                        adapter,
                        q,
                        size=args.size,
                        batch=batch,
                        concurrency=concurrency,
                        duration_s=args.duration,
                        messages_max=args.messages_max,
                    )
                )
        q = _queue("consume")
        await adapter.create_queue(q, ["g"])
        on_result(
            await workloads.consume(
                adapter,
                q,
                "g",
                size=args.size,
                batch=args.consume_batch,
                concurrency=args.consume_concurrency,
                prefill=args.consume_prefill,
                duration_s=args.duration * 3,
            )
        )
        q = _queue("e2e")
        await adapter.create_queue(q, ["g"])
        on_result(
            await workloads.end_to_end(
                adapter, q, "g", size=args.size, rate=args.e2e_rate, duration_s=args.duration
            )
        )
        groups = ["g1", "g2", "g3"]
        # Acking groups of a queue; then, where the adapter can, groups reading a stream by
        # offsets (no ack per message).
        readers: list[OffsetReader | None] = [None]
        if isinstance(adapter, OffsetReader):
            readers.append(adapter)
        for reader in readers:
            if reader is None:
                q = _queue("fanout")
                await adapter.create_queue(q, groups)
            else:
                q = _queue("fanout-offsets")
                await reader.create_stream(q, groups)
            on_result(
                await workloads.fanout(
                    adapter,
                    q,
                    groups,
                    size=args.size,
                    rate=args.e2e_rate,
                    duration_s=args.duration,
                    reader=reader,
                )
            )
    finally:
        await adapter.close()


def row(broker: str, nodes: int, durability: str, r: RunResult) -> dict[str, Any]:
    d = r.as_dict()
    d.update({"broker": broker, "nodes": nodes, "durability": durability})
    d["label"] = label(d)
    return d


def label(d: dict[str, Any]) -> str:
    w = d["workload"]
    if w == "publish":
        return f"publish b={d['batch']} c={d['concurrency']}"
    if w == "consume":
        return f"consume b={d['batch']} c={d['concurrency']}"
    return f"{w} @{d['rate']:g}/s"


def _collector(
    rows: list[dict[str, Any]], broker: str, nodes: int, adapter: Adapter
) -> Callable[[RunResult], None]:
    def on_result(r: RunResult) -> None:
        last = row(broker, nodes, adapter.durability, r)
        rows.append(last)
        print(
            f"  {last['label']:<28} {last['msg_per_s']:>9,} msg/s  "
            f"p50 {last['p50_ms']:.2f} p99 {last['p99_ms']:.2f} ms  "
            f"cpu client {last['client_cpu_s']:.1f}s server {last['server_cpu_s']:.1f}s",
            file=sys.stderr,
        )

    return on_result


@contextlib.contextmanager
def running(cluster: Cluster) -> Iterator[Cluster]:
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def run(
    args: argparse.Namespace, stamp: str
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    rows: list[dict[str, Any]] = []
    versions: dict[str, Any] = {}
    profiles: dict[str, str] = {}
    for nodes in args.nodes:
        for broker in args.brokers:
            root = Path(tempfile.mkdtemp(prefix=f"fluxmq-compare-{broker}{nodes}-"))
            t0 = time.monotonic()
            cluster = make_cluster(broker, root, nodes)
            with contextlib.ExitStack() as cleanup:
                cleanup.callback(shutil.rmtree, root, ignore_errors=True)
                cleanup.enter_context(running(cluster))
                started_s = time.monotonic() - t0
                versions[broker] = cluster.versions()
                adapter = cluster.adapter()
                print(f"{broker} x{nodes}: started in {started_s:.1f} s", file=sys.stderr)

                asyncio.run(run_workloads(adapter, args, _collector(rows, broker, nodes, adapter)))
                if args.profile and broker == "fluxmq" and nodes == max(args.nodes):
                    found = asyncio.run(profile_fluxmq(cluster, cluster.adapter(), args, stamp))
                    profiles.update({f"{k}, {nodes} node(s)": v for k, v in found.items()})
    return rows, versions, profiles


def _by(rows: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, dict[str, Any]]]:
    out: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["nodes"], r["label"]), {})[r["broker"]] = r
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, measured: 3 nodes, each broker's best publish rate at the same batch
    size (one message per call, and batches); e2e p99 at the same offered load."""
    best: dict[tuple[str, int], float] = {}
    for r in rows:
        if r["workload"] == "publish" and r["nodes"] == 3:
            key = (r["broker"], r["batch"])
            best[key] = max(best.get(key, 0.0), float(r["msg_per_s"]))
    lines = []
    for batch in sorted({b for (broker, b) in best if broker == "fluxmq"}):
        flux = best[("fluxmq", batch)]
        how = "one message per call" if batch == 1 else f"batches of {batch}"
        for peer, goal in (("rabbitmq", GOAL_RABBIT_RATIO), ("nats", GOAL_NATS_RATIO)):
            other = best.get((peer, batch))
            if other is None:
                continue
            ratio = flux / other
            lines.append(
                f"- 3-node publish, {how}, best of the concurrencies: FluxMQ {flux:,.0f} msg/s "
                f"vs {peer} {other:,.0f} msg/s: **{ratio:.2f}x** "
                f"(goal >= {goal:g}x: {'met' if ratio >= goal else 'NOT met'})"
            )
    e2e = {r["broker"]: r for r in rows if r["workload"] == "end_to_end" and r["nodes"] == 3}
    if "fluxmq" in e2e:
        f = e2e["fluxmq"]["p99_ms"]
        for peer in ("rabbitmq", "nats"):
            if peer in e2e:
                p = e2e[peer]["p99_ms"]
                rate = e2e["fluxmq"]["rate"]
                achieved = (e2e["fluxmq"]["published_per_s"], e2e[peer]["published_per_s"])
                lines.append(
                    f"- 3-node end-to-end p99 at {rate:g} msg/s offered (published "
                    f"{achieved[0]:,}/s vs {achieved[1]:,}/s): "
                    f"FluxMQ {f:.1f} ms vs {peer} {p:.1f} ms "
                    f"(goal lower: {'met' if f < p else 'NOT met'})"
                )
    return lines


def markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        f"Run {info['stamp']} (`python -m bench {info['argv']}`) on {info['cores']} cores "
        f"({info['cpu']}), Python {info['python']}; versions: "
        + "; ".join(
            f"{b}: " + ", ".join(f"{k} {v}" for k, v in vs.items())
            for b, vs in info["versions"].items()
        )
        + ".",
        "",
        "Ratios are FluxMQ / peer within this run (the machine is noisy: compare ratios, not "
        "runs). msg/s counts confirmed publishes, acked messages, or deliveries (fanout: 3 per "
        "message). CPU seconds: client = this one Python process, server = the broker's "
        "processes.",
        "",
    ]
    lines += ["### Goals", "", *(goals(rows) or ["- (no 3-node rows for every broker)"]), ""]
    brokers = [b for b in BROKERS if any(r["broker"] == b for r in rows)]
    # Ratio columns only when FluxMQ ran: they are FluxMQ / each peer.
    peers = [b for b in brokers if b != "fluxmq"] if "fluxmq" in brokers else []
    for nodes in sorted({r["nodes"] for r in rows}):
        lines += [
            f"### {nodes} node{'s' if nodes > 1 else ''}",
            "",
            "| "
            + " | ".join(
                ["workload"]
                + [f"{b} {what}" for b in brokers for what in ("msg/s", "p50/p99/p999 ms")]
                + [f"fluxmq / {b}" for b in peers]
            )
            + " |",
            "|---|" + "---:|---:|" * len(brokers) + "---:|" * len(peers),
        ]
        for (n, lbl), per in _by(rows).items():
            if n != nodes:
                continue
            cells = []
            for b in brokers:
                r = per.get(b)
                cells.append(f"{r['msg_per_s']:,}" if r else "")
                cells.append(
                    f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} / {r['p999_ms']:.1f}" if r else ""
                )
            flux = per.get("fluxmq")
            ratios = [
                _ratio(flux["msg_per_s"], per[b]["msg_per_s"]) if flux and b in per else ""
                for b in peers
            ]
            lines.append(f"| {lbl} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    lines += ["### Durability of each broker in these runs", ""]
    seen = set()
    for r in rows:
        if r["broker"] not in seen:
            seen.add(r["broker"])
            lines.append(f"- **{r['broker']}**: {r['durability']}.")
    lines += ["", "### CPU per run (client s / server s)", ""]
    lines += [
        "| nodes | workload | " + " | ".join(brokers) + " |",
        "|---|---|" + "---:|" * len(brokers),
    ]
    for (n, lbl), per in _by(rows).items():
        cells = [
            f"{per[b]['client_cpu_s']:.1f} / {per[b]['server_cpu_s']:.1f}" if b in per else ""
            for b in brokers
        ]
        lines.append(f"| {n} | {lbl} | " + " | ".join(cells) + " |")
    if info.get("profiles"):
        lines += ["", "### Where FluxMQ's time goes (py-spy of the leader)", ""]
        for name, text in info["profiles"].items():
            lines += [f"{name}:", "", "```", text, "```", ""]
    lines += ["", f"Plots: `{info['plots'][0]}`, `{info['plots'][1]}`.", ""]
    return "\n".join(lines)


def plots(rows: list[dict[str, Any]], out: Path, stamp: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"compare-{stamp}-throughput.png", f"compare-{stamp}-latency.png"]
    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["workload"] == "publish":
            key = f"{r['broker']} x{r['nodes']} b={r['batch']}"
            series.setdefault(key, []).append((r["concurrency"], r["msg_per_s"]))
    for key, pts in sorted(series.items()):
        pts.sort()
        ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent publishers")
    ax.set_ylabel("confirmed msg/s")
    ax.set_title("publish throughput vs concurrency (durable, same machine, same run)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / names[0], dpi=100)
    plt.close(fig)

    lat = [r for r in rows if r["workload"] in ("end_to_end", "fanout", "fanout_offsets")]
    fig, ax = plt.subplots(figsize=(max(8.0, len(lat) * 0.8), 5))
    width = 0.27
    xs = range(len(lat))
    for i, (q, name) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p999"))):
        vals = [r[q] if not math.isnan(r[q]) else 0 for r in lat]
        ax.bar([x + i * width for x in xs], vals, width, label=name)
    ax.set_xticks([x + width for x in xs])
    ax.set_xticklabels(
        [f"{r['broker']} x{r['nodes']}\n{r['workload']}" for r in lat], fontsize=7, rotation=30
    )
    ax.set_yscale("log")
    ax.set_ylabel("publish -> delivered, ms (log)")
    ax.set_title("end-to-end latency percentiles at the same offered load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / names[1], dpi=100)
    plt.close(fig)
    return names


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import os

    return {"python": platform.python_version(), "cpu": cpu, "cores": os.cpu_count()}


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--brokers", type=_csv(str), default=list(BROKERS), help="default all")
    p.add_argument("--nodes", type=_csv(int), default=[1, 3], help="cluster sizes: 1,3")
    p.add_argument("--size", type=int, default=256, help="message bytes (default 256)")
    p.add_argument("--concurrency", type=_csv(int), default=[1, 4, 16], help="publishers")
    p.add_argument("--batch", type=int, default=100, help="messages per call in batch rows")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    p.add_argument("--messages-max", type=int, default=1_000_000, help="bound per run")
    p.add_argument("--consume-prefill", type=int, default=20_000)
    p.add_argument("--consume-batch", type=int, default=100)
    p.add_argument("--consume-concurrency", type=int, default=4)
    p.add_argument("--e2e-rate", type=float, default=200.0, help="msg/s offered in e2e/fanout")
    p.add_argument("--profile", action="store_true", help="py-spy FluxMQ's leader (largest size)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    args = p.parse_args(argv)
    unknown = [b for b in args.brokers if b not in BROKERS]
    if unknown or not set(args.nodes) <= {1, 3}:
        p.error(f"--brokers from {BROKERS}, --nodes from 1,3")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows, versions, profiles = run(args, stamp)
    info = {
        **machine(),
        "stamp": stamp,
        "argv": " ".join(sys.argv[1:] if argv is None else argv),
        "versions": versions,
        "profiles": profiles,
    }
    info["plots"] = plots(rows, out, stamp)
    (out / f"compare-{stamp}.json").write_text(
        json.dumps({"machine": info, "results": rows}, indent=2, default=str)
    )
    md = markdown(rows, info)
    (out / f"compare-{stamp}.md").write_text(md)
    print(md)
    if args.write_results:
        write_section("peers", "## FluxMQ vs RabbitMQ and NATS (`python -m bench`)\n\n" + md)
    return 0
