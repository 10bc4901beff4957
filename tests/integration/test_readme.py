"""The README's Python tour runs as written against a real node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import Node

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tour_runs_against_a_node(node: Node) -> None:
    match = re.search(r"<!-- tour -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README lost its tour block"
    proc = subprocess.run(
        [sys.executable, "-c", match.group(1)],
        env={**os.environ, "FLUXMQ_ADDR": node.address},
        capture_output=True,
        timeout=60,
    )
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "stored at" in out and "b'signed up'" in out and "INVALID_ARGUMENT" in out
