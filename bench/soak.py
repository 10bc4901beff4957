"""``python -m bench.soak --schedules 100``: a hundred seeded fault schedules (mixed modes and
fault kinds, tests/chaos), one after another on fresh clusters; a table of every schedule
(seed, faults, acked, lost, duplicated, unexpected, divergence, longest write outage) and the
longest outage per fault kind, written into bench/RESULTS.md. Exits 1 on any violation; the
report of each failing schedule (timeline, checker summary, node logs) is written beside the
results. Runs as root (iptables partitions); about 40 s per schedule."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.results_md import RESULTS, write_section
from tests.chaos.harness import Report, run_schedule
from tests.chaos.schedule import plan

SECTION = "soak"  # its section of bench/RESULTS.md (bench/results_md.py)


def row(report: Report) -> dict[str, object]:
    v = report.verdict
    return {
        "seed": report.schedule.seed,
        "mode": report.schedule.mode,
        "faults": [s.kind for s in report.schedule.steps],
        "acked": report.acked,
        "lost": len(v.lost) if v else None,
        "duplicated": len(v.duplicated) if v else None,
        "unexpected": len(v.unexpected) if v else None,
        "reordered": len(v.reordered) if v else None,
        "divergent": len(v.divergent) if v else None,
        "group": len(v.group) if v else None,
        "outage_ms": report.outage_ms,
        "ok": report.ok,
        "problems": report.problems,
    }


def table(rows: list[dict[str, object]], started: str, elapsed_s: float) -> str:
    bad = [r for r in rows if not r["ok"]]
    totals = {k: sum(int(r[k] or 0) for r in rows) for k in ("acked", "lost", "duplicated")}
    lines = [
        "## Fault schedules soak (`python -m bench.soak --schedules 100`)",
        "",
        f"{len(rows)} schedules, started {started}, {elapsed_s / 60:.0f} min; "
        f"{totals['acked']} messages acknowledged in all, {totals['lost']} lost, "
        f"{totals['duplicated']} duplicated; {len(bad)} schedules with a violation or a failed "
        "run.",
        "",
        "Longest write outage per fault kind (the longest time no publish succeeded, over the "
        "schedules with that fault):",
        "",
        "| fault | schedules | longest outage (s) |",
        "|---|---:|---:|",
    ]
    per_kind: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        for kind in set(r["faults"]):  # type: ignore[arg-type]
            per_kind[kind].append(int(r["outage_ms"]))  # type: ignore[call-overload]
    for kind, outages in sorted(per_kind.items()):
        lines.append(f"| {kind} | {len(outages)} | {max(outages) / 1000:.1f} |")
    lines += [
        "",
        "| seed | mode | faults | acked | lost | dup | unexpected | reordered | divergent "
        "| group | outage (s) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [
            str(r["seed"]), str(r["mode"]), ", ".join(r["faults"]),  # type: ignore[arg-type]
            *(str(r[k]) for k in (
                "acked", "lost", "duplicated", "unexpected", "reordered", "divergent", "group"
            )),
            f"{int(r['outage_ms']) / 1000:.1f}",  # type: ignore[call-overload]
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    ap.add_argument("--schedules", type=int, default=100, help="how many seeds (default 100)")
    ap.add_argument("--first-seed", type=int, default=1000, help="seeds first..first+n-1")
    ap.add_argument("--results-md", type=Path, default=RESULTS)
    ap.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = ap.parse_args(argv)
    if not 1 <= args.schedules <= 1000:
        ap.error("--schedules: 1..1000")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.monotonic()
    rows: list[dict[str, object]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in range(args.first_seed, args.first_seed + args.schedules):
        schedule = plan(seed)
        with tempfile.TemporaryDirectory(prefix=f"fluxmq-soak-{seed}-") as tmp:
            report = run_schedule(schedule, Path(tmp))
        rows.append(row(report))
        state = "ok" if report.ok else "VIOLATION"
        print(
            f"[{len(rows)}/{args.schedules}] {schedule.describe()}: {state}, "
            f"{report.acked} acked, outage {report.outage_ms / 1000:.1f} s",
            flush=True,
        )
        if not report.ok:
            failure = args.out.with_name(f"soak-seed-{seed}.txt")
            failure.write_text(report.text())
            print(f"  report: {failure}", flush=True)
        args.out.write_text(json.dumps(rows, indent=1))
    write_section(SECTION, table(rows, started, time.monotonic() - t0), args.results_md)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
