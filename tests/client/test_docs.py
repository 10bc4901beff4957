"""The README's SDK blocks and the examples/ scripts run as written against a real node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Node

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(node: Node, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "FLUXMQ_ADDR": node.address},
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def block(name: str) -> str:
    match = re.search(
        rf"<!-- {name} -->\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S
    )
    assert match, f"README lost its {name} block"
    return match.group(1)


def test_readme_sdk_blocks_run_against_a_node(broker: Node) -> None:
    out = run(broker, "-c", block("sdk-async"))
    assert "stored at 0 0" in out and "11 acked" in out and "QUEUE_NOT_FOUND" in out
    assert "ada@example.com attempt 1" in out
    assert re.search(r"^tailed \d+ 0 ", out, re.M)
    out = run(broker, "-c", block("sdk-sync"))
    assert "thumbnails" in out


def test_examples_run_against_a_node(broker: Node) -> None:
    out = run(broker, "examples/producer.py", "--count", "50")
    assert "published 50 orders" in out
    out = run(broker, "examples/consumer.py", "--max", "50")
    assert out.count("billed order") >= 50 and "stopped: " in out
    out = run(broker, "examples/admin.py")
    assert "orders: 50 messages" in out and "orders/billing: 0 members" in out


def test_sdk_bench_runs_end_to_end() -> None:
    """bench/sdk.py (tiny counts), so that it cannot rot unnoticed."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sdk", "--messages", "2000", "--drain", "1000",
         "--rounds", "1"],
        capture_output=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert "BufferedProducer / raw Publish:" in out and "SDK consume() / raw Lease+Ack:" in out
