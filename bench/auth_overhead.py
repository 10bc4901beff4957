"""What API keys and rate limiting cost: single-node publish throughput with auth off and on,
alternating runs on the same machine in one session (the machines are noisy: compare the
ratio). Each run: a fresh node, 4 client threads, publishing for ``--seconds``, one message per
call and batches of 100.

    python -m bench.auth_overhead [--seconds 5] [--rounds 3] [--write-results]
"""

from __future__ import annotations

import argparse
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
from fluxmq.launcher import free_port

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


def measure(address: str, key: str, auth: bool, batch: int, seconds: float) -> float:
    # The header is sent either way: the client's cost of carrying it is not the broker's, and
    # a node with auth off ignores it. What differs is the server's checking.
    md = (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        name = f"q{batch}"
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), metadata=md)
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
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    results: dict[tuple[bool, int], list[float]] = {}
    for r in range(max(1, min(args.rounds, 10))):
        for auth in (False, True) if r % 2 == 0 else (True, False):  # alternate the order
            root = Path(tempfile.mkdtemp(prefix="fluxmq-auth-bench-"))
            proc, address, key = start(root, auth)
            try:
                for batch in (1, 100):
                    rate = measure(address, key, auth, batch, args.seconds)
                    results.setdefault((auth, batch), []).append(rate)
                    print(
                        f"round {r} auth={'on ' if auth else 'off'} batch={batch:3d}: "
                        f"{rate:,.0f} msg/s"
                    )
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
                shutil.rmtree(root, ignore_errors=True)
    lines = [
        "## Cost of authentication (`python -m bench.auth_overhead`)",
        "",
        f"Single node, {THREADS} client threads, 256-byte messages, {args.seconds:g} s per run, "
        f"{args.rounds} rounds alternating which goes first (median shown). Every call carries an "
        "API key either way; auth on = the node parses it, hashes it (salted SHA-256), checks "
        "role and environment and rate-limits it (token bucket). In-process, one admit takes "
        "about 8 us.",
        "",
        "| publish | auth off | auth on | on / off |",
        "|---|---|---|---|",
    ]
    for batch in (1, 100):
        off = statistics.median(results[(False, batch)])
        on = statistics.median(results[(True, batch)])
        lines.append(
            f"| {'one message per call' if batch == 1 else f'batches of {batch}'} | "
            f"{off:,.0f} msg/s | {on:,.0f} msg/s | {on / off:.3f} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    if args.write_results:
        write_section("auth_overhead", md)


if __name__ == "__main__":
    main()
