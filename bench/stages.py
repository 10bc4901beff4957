"""The latency budget of a replicated publish, stage by stage: ``python -m bench.stages``.

A fresh 3-node cluster on loopback (metrics on); one-message publishes at each concurrency
(c=1 and c=16 by default) for ``--duration`` seconds each. Before and after each run the
leader's ``fluxmq_raft_stage_seconds`` histograms are scraped, and the difference gives, per
stage (raft/stages.py), how many sampled proposals passed it, their mean and their p50 / p99
(interpolated within histogram buckets). The means add up to the server's share of a publish;
the client's own p50 is shown beside them.

``--label`` names the build measured (e.g. "before" / "after"); ``--write-results`` puts the
table into bench/RESULTS.md's ``stages-<label>`` section. Bounded: each run stops at its
duration or ``--messages-max``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from bench.cluster import FluxCluster
from bench.fluxmq_driver import free_port
from bench.peers import workloads
from bench.peers.fluxmq import FluxAdapter
from bench.results_md import write_section
from raft.stages import STAGES

METRIC = "fluxmq_raft_stage_seconds"
Histogram = dict[str, dict[str, float]]  # stage -> {"count", "sum", "le=<bound>" ...}


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


# Disk histograms shown beside the stages: what one fsync'd commit costs on this machine.
DISK_METRICS = {
    "journal flush (append + fdatasync)": "fluxmq_raft_journal_fsync_seconds",
    "state apply commit (txn + fsync)": "fluxmq_apply_commit_seconds",
}


def disk_means(after: str, before: str) -> dict[str, float]:
    """Mean milliseconds of each DISK_METRICS histogram between two scrapes (all shards)."""

    def totals(text: str, metric: str) -> tuple[float, float]:
        total_s = count = 0.0
        for line in text.splitlines():
            if line.startswith(metric + "_sum"):
                total_s += float(line.rsplit(" ", 1)[1])
            elif line.startswith(metric + "_count"):
                count += float(line.rsplit(" ", 1)[1])
        return total_s, count

    out: dict[str, float] = {}
    for name, metric in DISK_METRICS.items():
        (s1, c1), (s0, c0) = totals(after, metric), totals(before, metric)
        if c1 > c0:
            out[name] = 1000 * (s1 - s0) / (c1 - c0)
    return out


def scrape(text: str) -> Histogram:
    out: Histogram = defaultdict(dict)
    for line in text.splitlines():
        if not line.startswith(METRIC):
            continue
        name_labels, value = line.rsplit(" ", 1)
        labels = dict(
            part.split("=", 1)
            for part in name_labels[name_labels.index("{") + 1 : -1].split(",")
            if "=" in part
        )
        stage = labels.get("stage", "").strip('"')
        if name_labels.startswith(METRIC + "_bucket"):
            out[stage]["le=" + labels["le"].strip('"')] = float(value)
        elif name_labels.startswith(METRIC + "_count"):
            out[stage]["count"] = float(value)
        elif name_labels.startswith(METRIC + "_sum"):
            out[stage]["sum"] = float(value)
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Linear interpolation within cumulative ``(upper bound, count)`` buckets.

    >>> quantile([(1.0, 50), (2.0, 100), (float("inf"), 100)], 0.75)
    1.5
    """
    total = buckets[-1][1]
    if total <= 0:
        return float("nan")
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * (
                (rank - lower_count) / span if span else 1
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def difference(after: Histogram, before: Histogram) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for stage in STAGES:
        a, b = after.get(stage, {}), before.get(stage, {})
        count = a.get("count", 0.0) - b.get("count", 0.0)
        if count <= 0:
            continue
        buckets = sorted((float(k[3:]), a[k] - b.get(k, 0.0)) for k in a if k.startswith("le="))
        rows[stage] = {
            "count": count,
            "mean_ms": 1000 * (a.get("sum", 0.0) - b.get("sum", 0.0)) / count,
            "p50_ms": 1000 * quantile(buckets, 0.5),
            "p99_ms": 1000 * quantile(buckets, 0.99),
        }
    return rows


async def measure(
    cluster: FluxCluster, metrics_url: str, concurrency: int, duration_s: float, messages_max: int
) -> dict[str, object]:
    leader = await cluster.wait_leader()
    adapter = FluxAdapter(leader.address, len(cluster.nodes), [], sdk=False)
    await adapter.connect()
    try:
        queue = f"stages-c{concurrency}-{time.monotonic_ns()}"
        await adapter.create_queue(queue, ["g"])
        before_text = fetch(metrics_url)
        before = scrape(before_text)
        result = await workloads.publish(
            adapter,
            queue,
            size=256,
            batch=1,
            concurrency=concurrency,
            duration_s=duration_s,
            messages_max=messages_max,
        )
        after_text = fetch(metrics_url)
        after = scrape(after_text)
    finally:
        await adapter.close()
    return {
        "concurrency": concurrency,
        "rate_msg_s": result.rate,
        "client_p50_ms": result.percentile(0.5),
        "client_p99_ms": result.percentile(0.99),
        "disk": disk_means(after_text, before_text),
        "stages": difference(after, before),
    }


def markdown(label: str, runs: list[dict[str, object]]) -> str:
    lines = [f"### Latency budget, 3 nodes, one 256 B message per publish ({label})", ""]
    header = "| stage (time since the previous one) |"
    rule = "|---|"
    for run in runs:
        c = run["concurrency"]
        header += f" c={c} mean | p50 | p99 |"
        rule += "---:|---:|---:|"
    lines += [header, rule]
    for stage in STAGES:
        cells = ""
        for run in runs:
            row = run["stages"].get(stage)  # type: ignore[attr-defined]
            if row is None:
                cells += " - | - | - |"
            else:
                cells += f" {row['mean_ms']:.3f} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} |"
        lines.append(f"| {stage} |{cells}")
    total = "| **sum of means** |"
    client = "| client-side p50 / p99, rate |"
    for run in runs:
        stages = run["stages"]
        s = sum(r["mean_ms"] for r in stages.values())  # type: ignore[attr-defined]
        total += f" **{s:.2f}** | | |"
        client += (
            f" {run['client_p50_ms']:.2f} | {run['client_p99_ms']:.2f} |"
            f" {run['rate_msg_s']:.0f}/s |"
        )
    lines += [total, client]
    for name in DISK_METRICS:
        cells = ""
        for run in runs:
            mean = run["disk"].get(name)  # type: ignore[attr-defined]
            cells += " - | | |" if mean is None else f" {mean:.3f} | | |"
        lines.append(f"| for reference: {name}, mean |{cells}")
    lines.append("")
    lines.append(
        "Sampled proposals (at most one frame per 5 ms) on the leader; each stage is the time "
        "from the previous stamp (raft/stages.py). p50/p99 are interpolated within histogram "
        "buckets."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--messages-max", type=int, default=200_000)
    ap.add_argument("--label", default="now")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="fluxmq-stages-") as tmp:
        cluster = FluxCluster(Path(tmp), 3)
        ports = {}
        for node in cluster.nodes:
            ports[node.address] = free_port()
            node.extra = (*node.extra, "--metrics-listen", f"127.0.0.1:{ports[node.address]}")
        cluster.start()
        try:
            leader = asyncio.run(cluster.wait_leader())
            url = f"http://127.0.0.1:{ports[leader.address]}/metrics"
            runs = [
                asyncio.run(measure(cluster, url, c, args.duration, args.messages_max))
                for c in levels
            ]
        finally:
            cluster.stop()
    md = markdown(args.label, runs)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M")
    (args.out / f"stages-{args.label}-{stamp}.json").write_text(json.dumps(runs, indent=2))
    if args.write_results:
        write_section(f"stages-{args.label}", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
