"""A node restarted on a data directory waits for the previous node's shard process to be gone
(it dies with its front end, a moment later), and says so when it does not go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fluxmq.server.shard_process import shard_edge
from fluxmq.server.shard_process.supervisor import PID_FILE, child_pids, wait_previous_gone


def test_no_pid_file_or_a_dead_pid_does_not_wait(tmp_path: Path) -> None:
    assert wait_previous_gone(str(tmp_path), timeout_s=0.1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / PID_FILE).write_text(f"{dead.pid}\n")
    assert wait_previous_gone(str(tmp_path), timeout_s=0.1)


def test_a_process_that_is_not_a_shard_process_is_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / PID_FILE).write_text(f"{os.getpid()}\n")  # a reused pid: this test
    assert wait_previous_gone(str(tmp_path), timeout_s=0.1)


def test_a_shard_process_still_running_is_waited_for_then_reported(tmp_path: Path) -> None:
    env = {**os.environ, shard_edge.SHARD_FD_ENV: "99"}
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        (tmp_path / PID_FILE).write_text(f"{lingering.pid}\n")
        assert lingering.pid in child_pids(os.getpid())
        assert not wait_previous_gone(str(tmp_path), timeout_s=0.2)
    finally:
        lingering.kill()
        lingering.wait()
    assert wait_previous_gone(str(tmp_path), timeout_s=0.2)
