"""The benchmark harness runs end to end (tiny counts), so it cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_harness_runs_and_writes_results(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "flux", "--duration", "0.5", "--messages-max", "2000",
         "--out", str(tmp_path)],
        capture_output=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    (result,) = tmp_path.glob("*.json")
    runs = json.loads(result.read_text())["results"]
    assert [r["workload"] for r in runs] == [
        "publish", "fetch", "publish@50%", "lease_ack", "consume_max", "consume_latency",
        "cluster_publish", "cluster_publish@50%", "cluster_publish_via_follower",
        "cluster_failover",
    ]  # fmt: skip
    assert runs[0]["messages"] > 0 and runs[1]["messages"] == runs[0]["messages"] + 100
    lease, peak, paced = runs[3:6]
    assert lease["drained"] and lease["messages"] == lease["prefilled"]
    assert lease["not_acked"] == 0 and lease["lease_p99_ms"] > 0
    assert peak["messages"] > 0 and paced["delivered"] == paced["published"] > 0
    cluster, cluster_paced, via_follower, failover = runs[6:]
    assert cluster["messages"] > 0 and via_follower["messages"] > 0
    assert cluster_paced["messages"] > 0 and cluster["server_cpu_s"] > 0
    # The leader was killed and publishing resumed through the new one.
    assert isinstance(failover["failover_s"], float) and failover["failover_s"] > 0
    (table,) = tmp_path.glob("*.md")
    assert "| publish |" in table.read_text() and "| cluster_failover |" in table.read_text()


def test_comparison_harness_runs_fluxmq_through_every_workload(tmp_path: Path) -> None:
    """``python -m bench`` with FluxMQ only (the peers need their servers installed; `make
    bench` runs them): every workload, both cluster sizes, JSON + markdown + both plots."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--brokers", "fluxmq", "--nodes", "1,3",
         "--duration", "0.4", "--concurrency", "1,2", "--consume-prefill", "300",
         "--e2e-rate", "100", "--out", str(tmp_path)],
        capture_output=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    (result,) = tmp_path.glob("compare-*.json")
    rows = json.loads(result.read_text())["results"]
    labels = [(r["nodes"], r["label"]) for r in rows]
    for nodes in (1, 3):
        assert [lbl for n, lbl in labels if n == nodes] == [
            "publish b=1 c=1", "publish b=1 c=2", "publish b=100 c=1", "publish b=100 c=2",
            "consume b=100 c=4", "end_to_end @100/s", "fanout @100/s",
            "fanout_offsets @100/s",
        ]  # fmt: skip
    for r in rows:
        assert r["messages"] > 0 and r["server_cpu_s"] >= 0, r
    # CPU is read in 10 ms clock ticks per process: a 0.2 s run may show none, all runs not.
    assert sum(r["server_cpu_s"] for r in rows) > 0
    consume = [r for r in rows if r["workload"] == "consume"]
    assert all(r["drained"] and r["messages"] == 300 for r in consume)
    paced = [r for r in rows if r["workload"] in ("end_to_end", "fanout", "fanout_offsets")]
    assert all(r["complete"] for r in paced), paced  # every message delivered to every group
    assert all(r["delivered"] == r["published"] * r["groups"] for r in paced)
    for png in tmp_path.glob("compare-*.png"):
        assert png.read_bytes().startswith(b"\x89PNG")
    assert len(list(tmp_path.glob("compare-*.png"))) == 2
    assert "| publish b=100 c=1 |" in next(tmp_path.glob("compare-*.md")).read_text()
    assert _leftovers("fluxmq-compare-") == []  # every node stopped, data dirs removed


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line mentions ``marker`` (the harness's data directories)."""
    import glob
    import os

    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmdline = Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and str(os.getpid()) not in path:
            found.append(cmdline)
    leftover_dirs = glob.glob(f"/tmp/{marker}*")
    return found + leftover_dirs
