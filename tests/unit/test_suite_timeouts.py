"""The suite's own timeout (pyproject's pytest-timeout settings) ends a test that hangs while
its event loop stays busy: a hang in CI is a failure with stacks. With pytest-timeout's signal
method the Timeout is raised inside the running task, the test's gather swallows it, and the
hung test passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"

HANGING_TEST = """
import asyncio


async def spin():
    while True:
        sum(range(100_000))  # busy inside a task step when the timeout strikes
        await asyncio.sleep(0)


async def test_hangs():
    await asyncio.gather(spin(), return_exceptions=True)
"""


def test_a_hung_test_that_swallows_exceptions_still_ends_the_run(tmp_path: Path) -> None:
    module = tmp_path / "test_hanging.py"
    module.write_text(HANGING_TEST)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(PYPROJECT),
             "--rootdir", str(tmp_path), "--timeout", "2", str(module)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError("the hung test ran past its timeout: the run never ended") from None
    assert done.returncode != 0
    assert "Timeout" in done.stdout + done.stderr
