"""The report directory: ``summary.json``, ``report.md`` and ``chart.png`` (the violations'
Parquet files are written by the job). Plain Python over small collected results."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

SAMPLE_ROWS_DEFAULT = 20
CHART_BARS_MAX = 40  # partitions shown in the chart: the largest ones


@dataclass
class RuleResult:
    name: str
    title: str
    violations: int
    seconds: float
    sample: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violations == 0


@dataclass
class Summary:
    clean: bool
    source: str  # "data-dirs" or "archive"
    inputs: list[dict[str, str]]
    records: int
    logs: int
    group_partitions: int
    rules: list[RuleResult]
    groups: list[dict[str, Any]]  # rules.group_totals rows
    partitions: list[dict[str, Any]]  # per (node, queue, partition): records, and group lags
    seconds: float
    spark: dict[str, str]
    stores_read: int = 0  # of ``inputs``; the others are store_readable's findings

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["violations"] = sum(r.violations for r in self.rules)
        out["failed_rules"] = [r.name for r in self.rules if not r.ok]
        return out


def write(out: str, summary: Summary) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary.to_json(), f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    write_chart(os.path.join(out, "chart.png"), summary)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(summary))


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(s: Summary) -> str:
    verdict = (
        "**CLEAN**: every rule passed."
        if s.clean
        else f"**FAILED**: {sum(not r.ok for r in s.rules)} of {len(s.rules)} rules found "
        f"{sum(r.violations for r in s.rules)} violations."
    )
    lines = [
        "# FluxMQ audit report",
        "",
        verdict,
        "",
        f"Read {s.records:,} records in {s.logs:,} partition logs and "
        f"{s.group_partitions:,} group partitions from {len(s.inputs)} stores "
        f"({s.source}) in {s.seconds:.1f} s on Spark {s.spark.get('version', '?')} "
        f"({s.spark.get('master', '?')}).",
        "",
        "## Rules",
        "",
        "| rule | checks | violations | result | seconds |",
        "|---|---|---:|---|---:|",
    ]
    for r in s.rules:
        lines.append(
            f"| `{r.name}` | {_cell(r.title)} | {r.violations:,} | "
            f"{'pass' if r.ok else '**FAIL**'} | {r.seconds:.1f} |"
        )
    for r in s.rules:
        if r.ok:
            continue
        lines += [
            "",
            f"### `{r.name}`: {r.violations:,} violations (first {len(r.sample)})",
            "",
            "| node | group | queue | partition | offset | detail |",
            "|---|---|---|---:|---:|---|",
        ]
        for v in r.sample:
            lines.append(
                "| "
                + " | ".join(
                    _cell(v.get(k))
                    for k in ("node", "replication_group", "queue", "partition", "offset", "detail")
                )
                + " |"
            )
    lines += [
        "",
        "## Consumer groups",
        "",
        "published = acked + ready + leased + scheduled + dead + removed "
        "(removed: skipped by retention, purged, filtered out).",
        "",
        "| node | queue | group | published | acked | ready | leased | scheduled | dead "
        "| removed | lag |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in s.groups:
        lines.append(
            "| "
            + " | ".join(
                _cell(g.get(k))
                for k in (
                    "node",
                    "queue",
                    "group",
                    "published",
                    "acked",
                    "ready",
                    "leased",
                    "scheduled",
                    "dead",
                    "removed",
                    "lag",
                )
            )
            + " |"
        )
    if not s.groups:
        lines.append("| (no consumer groups) | | | | | | | | | | |")
    lines += [
        "",
        "## Inputs",
        "",
        "| node | replication group | path |",
        "|---|---|---|",
    ]
    lines += [
        f"| {_cell(i['node'])} | {_cell(i['replication_group'])} | {_cell(i['path'])} |"
        for i in s.inputs
    ]
    lines += [
        "",
        "## Chart",
        "",
        "![records and lag per partition](chart.png)",
        "",
        "Violations are in `violations/<rule>/` (Parquet); the numbers above are in "
        "`summary.json`.",
        "",
    ]
    return "\n".join(lines)


def write_chart(path: str, s: Summary) -> None:
    """Records per partition (one bar per node) and the lag of each group on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(s.partitions, key=lambda r: -int(r.get("records") or 0))[:CHART_BARS_MAX]
    labels = sorted({f"{r['queue']}/{r['partition']}" for r in rows})
    nodes = sorted({str(r["node"]) for r in rows})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8.0, 0.5 * len(labels) + 4), 8))
    width = 0.8 / max(1, len(nodes))
    for i, node in enumerate(nodes):
        counts = {f"{r['queue']}/{r['partition']}": r["records"] for r in rows if r["node"] == node}
        xs = [x + i * width for x in range(len(labels))]
        top.bar(xs, [counts.get(label, 0) for label in labels], width, label=node)
    top.set_title("records stored per partition")
    top.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=60)
    top.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    if nodes:
        top.legend(fontsize=7)
    lags: dict[str, int] = {}
    for r in rows:
        for group, lag in (r.get("lag") or {}).items():
            key = f"{r['queue']}/{r['partition']} {group}"
            lags[key] = max(lags.get(key, 0), int(lag))
    names = sorted(lags)
    bottom.bar(range(len(names)), [lags[n] for n in names], color="tab:orange")
    bottom.set_title("consumer group lag (high watermark - committed), worst replica")
    bottom.set_xticks(range(len(names)))
    bottom.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    if not names:
        bottom.text(0.5, 0.5, "no consumer groups", ha="center", transform=bottom.transAxes)
    verdict = "clean" if s.clean else "FAILED: " + ", ".join(r.name for r in s.rules if not r.ok)
    fig.suptitle(f"FluxMQ audit: {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
