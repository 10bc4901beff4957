"""What API keys and rate limiting cost: single-node publish throughput with auth off and on.

Two fresh nodes run side by side, one with auth off and one with auth on, and take turns: a
slice of ``--seconds`` on one, then a slice on the other (the order alternates per pair). The
machines are noisy and drift over minutes; a pair of adjacent slices sees the same machine, so
the figure is the median of the per-pair ratios. 4 client threads; one message per call and
batches of 100.

    python -m bench.auth_overhead [--seconds 2] [--pairs 10] [--write-results]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.results_md import write_section
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core.auth import new_key
from fluxmq.devcluster.launcher import free_port

THREADS = 4
CALLS_MAX = 10_000_000


def start(root: Path, auth: bool) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    key = new_key("production")
    (root / "key").write_text(key)
    cmd = [sys.executable, "-m", "fluxmq", "serve", "--data-dir", str(root / "data"),
           "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""]  # fmt: skip
    if auth:
        cmd += ["--auth", "on", "--auth-bootstrap-key-file", str(root / "key")]
    else:  # explicit: the comparison must not depend on the default (auto: off on one node)
        cmd += ["--auth", "off"]
    log = open(root / "node.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(address) as ch:
        while time.monotonic() < deadline:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return proc, address, key
            except grpc.RpcError:
                time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"node did not start: {(root / 'node.log').read_text()[-2000:]}")


def create_queue(address: str, key: str, name: str) -> None:
    with grpc.insecure_channel(address) as ch:
        queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=name)),
            metadata=(("authorization", f"Bearer {key}"),),
        )


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(address: str, key: str, name: str, batch: int, seconds: float) -> float:
    # The header is sent either way: the client's cost of carrying it is not the broker's, and
    # a node with auth off ignores it. What differs is the server's checking.
    md = (("authorization", f"Bearer {key}"),)
    counts = [0] * THREADS
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        with grpc.insecure_channel(address) as ch:
            s = queue_pb2_grpc.QueueServiceStub(ch)
            req = pb.PublishRequest(
                queue=name, messages=[pb.PublishMessage(value=b"x" * 256)] * batch
            )
            for _ in range(CALLS_MAX):
                if time.monotonic() >= stop:
                    return
                s.Publish(req, metadata=md, timeout=10)
                counts[i] += batch

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one slice")
    ap.add_argument("--pairs", type=int, default=10, help="slice pairs per batch size (1..50)")
    ap.add_argument(
        "--control",
        action="store_true",
        help="both nodes with auth off (an A/A run): the bias and noise floor of the method",
    )
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    pairs = max(1, min(args.pairs, 50))
    rates: dict[tuple[bool, int], list[float]] = {}
    ratios: dict[int, list[float]] = {}
    cpu: dict[tuple[bool, int], list[float]] = {}  # server CPU microseconds per message
    cpu_ratios: dict[int, list[float]] = {}
    roots = {auth: Path(tempfile.mkdtemp(prefix="fluxmq-auth-bench-")) for auth in (False, True)}
    nodes = {}
    try:
        for auth, root in roots.items():
            nodes[auth] = start(root, auth and not args.control)
        for batch in (1, 100):
            for _, address, key in nodes.values():
                create_queue(address, key, f"q{batch}")
            for n in range(pairs):
                pair, used = {}, {}
                for auth in (False, True) if n % 2 == 0 else (True, False):
                    proc, address, key = nodes[auth]
                    before = cpu_s(proc.pid)
                    pair[auth] = measure(address, key, f"q{batch}", batch, args.seconds)
                    messages = pair[auth] * args.seconds
                    used[auth] = (cpu_s(proc.pid) - before) * 1e6 / max(1.0, messages)
                    rates.setdefault((auth, batch), []).append(pair[auth])
                    cpu.setdefault((auth, batch), []).append(used[auth])
                ratios.setdefault(batch, []).append(pair[True] / pair[False])
                cpu_ratios.setdefault(batch, []).append(used[True] / used[False])
                print(
                    f"batch={batch:3d} pair {n}: off {pair[False]:,.0f} msg/s "
                    f"({used[False]:.1f} us CPU/msg), on {pair[True]:,.0f} msg/s "
                    f"({used[True]:.1f} us CPU/msg), on/off {pair[True] / pair[False]:.3f}",
                    flush=True,
                )
    finally:
        for proc, _, _ in nodes.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    lines = [
        "## Cost of authentication (`python -m bench.auth_overhead`)",
        "",
        f"Single node, {THREADS} client threads, 256-byte messages. Two nodes (auth off, auth "
        f"on) take turns in slices of {args.seconds:g} s, {pairs} pairs per row, the order "
        "alternating; on / off is the median of the per-pair ratios (adjacent slices see the "
        "same noisy machine), with the lowest and highest pair. Every call carries an API key "
        "either way; auth on = the node checks it (parse and salted SHA-256 the first time a "
        "key is seen, a remembered verdict after that), checks role and environment, and "
        "rate-limits it (token bucket). Throughput on a shared 2-core machine is noisy (see the "
        "spread of the pairs); the node's CPU time per message (from /proc, all threads) is the "
        "steadier measure of what checking costs.",
        "",
        "| publish | auth off (median) | auth on (median) | on / off | pairs: lowest .. highest "
        "| node CPU per message, off / on | CPU on / off |",
        "|---|---|---|---|---|---|---|",
    ]
    for batch in (1, 100):
        off = statistics.median(rates[(False, batch)])
        on = statistics.median(rates[(True, batch)])
        r = ratios[batch]
        cpu_off = statistics.median(cpu[(False, batch)])
        cpu_on = statistics.median(cpu[(True, batch)])
        lines.append(
            f"| {'one message per call' if batch == 1 else f'batches of {batch}'} | "
            f"{off:,.0f} msg/s | {on:,.0f} msg/s | {statistics.median(r):.3f} | "
            f"{min(r):.3f} .. {max(r):.3f} | {cpu_off:,.1f} us / {cpu_on:,.1f} us | "
            f"{statistics.median(cpu_ratios[batch]):.3f} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    if args.write_results:
        write_section("auth_overhead", md)


if __name__ == "__main__":
    main()
