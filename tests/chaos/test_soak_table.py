"""The soak's table: one row per schedule and the longest write outage per fault kind."""

from __future__ import annotations

from pathlib import Path

from bench.results_md import write_section
from bench.soak import SECTION, table


def _row(seed: int, faults: list[str], outage_ms: int, lost: int = 0) -> dict[str, object]:
    return {
        "seed": seed, "mode": "static", "faults": faults, "acked": 100, "lost": lost,
        "duplicated": 0, "unexpected": 0, "reordered": 0, "divergent": 0, "group": 0,
        "outage_ms": outage_ms, "ok": lost == 0, "problems": [],
    }  # fmt: skip


def test_the_table_has_a_row_per_schedule_and_the_longest_outage_per_fault(
    tmp_path: Path,
) -> None:
    rows = [
        _row(1, ["kill_leader", "kill_leader"], 2_500),
        _row(2, ["kill_leader", "stop_follower"], 4_000, lost=1),
    ]
    md = table(rows, "2026-11-25 19:00 UTC", 120.0)
    assert "| kill_leader | 2 | 4.0 |" in md and "| stop_follower | 1 | 4.0 |" in md
    assert "| 1 | static | kill_leader, kill_leader | 100 | 0 |" in md
    assert "200 messages acknowledged in all, 1 lost" in md
    assert "1 schedules with a violation" in md
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- generated -->\nflux\n")
    write_section(SECTION, md, results)
    write_section(SECTION, md, results)  # rewritten in place, not appended twice
    assert results.read_text().count("Fault schedules soak") == 1
