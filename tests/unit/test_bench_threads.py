"""bench/threads.py: CPU per thread is the difference of two samples, grouped by process role
and OS thread name, with threads that started in between counted from zero; and the thread
names raft/os_thread.py gives reach the kernel."""

from __future__ import annotations

import os
import threading

from bench.threads import markdown, per_thread, thread_cpu
from raft.os_thread import set_os_thread_name


def test_cpu_between_samples_adds_up_by_role_and_thread_name() -> None:
    before = {(1, 10): ("raft-driver", 1.0, 0.5), (1, 11): ("python", 2.0, 0.0)}
    after = {
        (1, 10): ("raft-driver", 1.5, 0.75),
        (1, 11): ("python", 2.0, 0.0),  # idle: left out
        (1, 12): ("journal-g1", 0.25, 0.25),  # started in between
        (2, 20): ("raft-driver", 0.5, 0.0),
    }
    spent = per_thread(before, after, {1: "leader", 2: "follower 1"})
    assert spent == {
        ("leader", "raft-driver"): (0.5, 0.25),
        ("leader", "journal-g1"): (0.25, 0.25),
        ("follower 1", "raft-driver"): (0.5, 0.0),
    }


def test_the_table_names_each_process_and_its_total() -> None:
    run = {
        "concurrency": 1,
        "messages": 100,
        "rate": 50.0,
        "p50_ms": 2.0,
        "us_per_message": {"leader|raft-driver": 700.0, "leader|python": 300.0},
        "system_us_per_message": {"leader|raft-driver": 100.0, "leader|python": 50.0},
    }
    text = markdown("now", [run])
    assert "| leader | raft-driver | 700.0 (100) |" in text
    assert "| **leader** | **all threads** | **1000.0** |" in text


def test_an_os_thread_name_is_what_proc_shows() -> None:
    seen: list[str] = []

    def named() -> None:
        assert set_os_thread_name("fx-test-thread-name-long")
        name, _user_s, _sys_s = thread_cpu(os.getpid())[threading.get_native_id()]
        seen.append(name)

    thread = threading.Thread(target=named)
    thread.start()
    thread.join()
    assert seen == ["fx-test-thread-"]  # the kernel keeps 15 bytes
