"""bench/RESULTS.md is shared by several benchmarks: each owns one marked section and rewrites
only that. ``python -m bench flux`` owns everything after ``<!-- generated -->`` (kept last)."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
GENERATED = "<!-- generated -->"


def write_section(name: str, md: str, path: Path = RESULTS) -> None:
    """Replace the section ``<!-- name -->`` .. ``<!-- /name -->`` with ``md``; a new section
    goes just before the flux suite's generated part."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    body = path.read_text() if path.exists() else "# Benchmark results\n\n"
    block = f"{start}\n{md.rstrip()}\n{end}\n\n"
    if start in body and end in body:
        before, rest = body.split(start, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        path.write_text(before + block + after)
    else:
        before, sep, after = body.partition(GENERATED)
        path.write_text(before + block + sep + after)
