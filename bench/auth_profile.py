"""Where auth's cost goes: py-spy samples of a node under publish load, auth off and on.

bench.auth_overhead measures throughput and CPU per message; this one asks what share of the
node's sampled Python time is spent under the security edge (``fluxmq/server/guard.py``,
``fluxmq/core/auth.py``, ``fluxmq/core/ratelimit.py`` and the interceptor's ``_admit``). The
same two-node set-up (one auth off, one on) takes turns, the order alternating per round.
Samples cover the node's Python threads only (py-spy), not gRPC's C core threads.

    python -m bench.auth_profile [--seconds 12] [--rounds 2] [--batch 100] [--write-results]

Needs py-spy (the ``bench`` extra) and the right to trace a child process (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.auth_overhead import cpu_s, create_queue, measure, start
from bench.results_md import write_section

SAMPLE_RATE_HZ = 250
# A stack with a frame in any of these files, or of these interceptor functions, is the
# security edge's time.
GUARD_FILES = frozenset(
    {"fluxmq/server/guard.py", "fluxmq/core/auth.py", "fluxmq/core/ratelimit.py"}
)
INTERCEPTORS_FILE = "fluxmq/server/interceptors.py"
GUARD_FUNCTIONS = frozenset({"_admit", "_authenticate", "_checked"})


def _in_guard(frame: str) -> bool:
    """``function (path:line)`` -> whether it is the security edge's."""
    function, _, where = frame.rpartition(" (")
    path = where.rsplit(":", 1)[0]
    if path.endswith(tuple(GUARD_FILES)):
        return True
    return path.endswith(INTERCEPTORS_FILE) and function in GUARD_FUNCTIONS


def guard_share(raw: str) -> tuple[int, float]:
    """py-spy ``raw`` (collapsed stacks, one ``frames count`` per line) -> (samples, share of
    them under the security edge).

    >>> guard_share("main (a.py:1);_admit (fluxmq/server/interceptors.py:9) 3\\nmain (a.py:1) 1\\n")
    (4, 0.75)
    """
    total = guarded = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        if any(_in_guard(frame) for frame in stack.split(";")):
            guarded += int(count)
    return total, guarded / total if total else 0.0


def record(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    cmd = [py_spy, "record", "-p", str(pid), "-r", str(SAMPLE_RATE_HZ), "-d", str(seconds),
           "-f", "raw", "-o", str(out), "--nonblocking"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=12, help="sampling per node and round (4..60)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of off+on (1..10)")
    ap.add_argument("--batch", type=int, default=100, help="messages per Publish (1..1000)")
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    seconds = max(4, min(args.seconds, 60))
    rounds = max(1, min(args.rounds, 10))
    batch = max(1, min(args.batch, 1000))
    load_s = seconds - 1.5  # inside the sampling window: py-spy needs a moment to attach
    work = Path(tempfile.mkdtemp(prefix="fluxmq-auth-profile-"))
    roots = {auth: work / ("on" if auth else "off") for auth in (False, True)}
    shares: dict[bool, list[float]] = collections.defaultdict(list)
    cpu: dict[bool, list[float]] = collections.defaultdict(list)
    rates: dict[bool, list[float]] = collections.defaultdict(list)
    nodes = {}
    try:
        for auth, root in roots.items():
            root.mkdir()
            nodes[auth] = start(root, auth)
            create_queue(nodes[auth][1], nodes[auth][2], "q")
        for n in range(rounds):
            for auth in (False, True) if n % 2 == 0 else (True, False):
                proc, address, key = nodes[auth]
                out = work / f"{'on' if auth else 'off'}{n}.txt"
                spy = record(proc.pid, seconds, out)
                time.sleep(0.5)
                before = cpu_s(proc.pid)
                rate = measure(address, key, "q", batch, load_s)
                used_us = (cpu_s(proc.pid) - before) * 1e6 / max(1.0, rate * load_s)
                _, err = spy.communicate(timeout=seconds + 30)
                if spy.returncode != 0 or not out.exists():
                    raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
                samples, share = guard_share(out.read_text())
                shares[auth].append(share)
                cpu[auth].append(used_us)
                rates[auth].append(rate)
                print(
                    f"round {n} auth {'on ' if auth else 'off'}: {rate:,.0f} msg/s, "
                    f"{used_us:.1f} us CPU/msg, {samples} samples, {100 * share:.2f}% under "
                    "the security edge",
                    flush=True,
                )
    finally:
        for proc, _, _ in nodes.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "## Where auth's time goes (`python -m bench.auth_profile`)",
        "",
        f"Single node, publish in batches of {batch}, 4 client threads; py-spy at "
        f"{SAMPLE_RATE_HZ} Hz for {seconds} s per node and round, {rounds} rounds, the order "
        "alternating. Share = samples whose stack passes through the guard, key parsing and "
        "hashing, the rate limiter or the interceptor's admit step, of all samples of the "
        "node's Python threads (gRPC's C core threads are not sampled).",
        "",
        "| node | msg/s (median) | node CPU per message (median) | share under the security "
        "edge (per round) |",
        "|---|---|---|---|",
    ]
    for auth in (False, True):
        lines.append(
            f"| auth {'on' if auth else 'off'} | {statistics.median(rates[auth]):,.0f} | "
            f"{statistics.median(cpu[auth]):.1f} us | "
            f"{', '.join(f'{100 * s:.2f}%' for s in shares[auth])} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write_results:
        write_section("auth_profile", text)


if __name__ == "__main__":
    main()
