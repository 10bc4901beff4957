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
import time


async def spin():
    while True:
        # Inside a task step when the timeout strikes. Blocking in a call that lets the GIL go
        # (not a busy loop): the timeout's thread then formats its stacks at once. Under a loop
        # that holds the GIL, every one of its GIL hand-offs waited the 5 ms switch interval,
        # and the dump took 50-90 s on a slow machine (the run ended, but past this test's bound).
        time.sleep(0.001)
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
