"""What an operator's restart costs writers: SIGTERM (graceful: leadership handed over first)
against kill -9 (a crash: the followers wait out the election timeout), on etcd + 3 nodes on
loopback.

A writer publishes one message per call (idempotency key per message) as fast as it can,
through the nodes that are not being stopped, retrying a failed call on the next node. Each
round stops the leader node one way, measures the longest gap between two acknowledgements
(the write outage), restarts the node and checks that every acknowledged message is stored
exactly once. Every call presents the cluster's admin API key (authentication is on in a
cluster).

    python -m bench.failover [--rounds 3] [--dir /tmp/fluxmq-bench-failover] [--write-results]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.cluster_meta import Metadata, auth_metadata, free_base_port
from bench.results_md import write_section
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.devcluster.launcher import LocalCluster, cluster_status

QUEUE = "failover"
BEFORE_S = 2.0  # writes before the stop
AFTER_S = 6.0  # writes after it
ROUNDS_MAX = 20
# Errors a retry cannot cure (a missing or wrong API key): the writer stops and the round fails.
FATAL_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def leader_index(cluster: LocalCluster) -> int:
    """1-based index of the node leading the home shard."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for i, address in enumerate(cluster.node_addresses, start=1):
            try:
                st = cluster_status(address, 2.0, cluster.api_key())
            except grpc.RpcError:
                continue
            if any(s["role"] == "leader" for s in st["shards"]):
                return i
        time.sleep(0.1)
    raise RuntimeError("no leader within 30 s")


class Writer:
    """Publishes ``m<round>-<n>`` one at a time through ``addresses``; records ack times."""

    def __init__(self, addresses: list[str], tag: str, metadata: Metadata) -> None:
        self.metadata = metadata
        self.channels = [grpc.insecure_channel(a) for a in addresses]
        self.stubs = [queue_pb2_grpc.QueueServiceStub(ch) for ch in self.channels]
        self.tag = tag
        self.acked: list[tuple[float, bytes]] = []
        self.errors = 0
        self.fatal: grpc.RpcError | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"writer-{tag}")

    def _run(self) -> None:
        n, k = 0, 0
        while not self.stop.is_set() and n < 1_000_000:
            value = f"{self.tag}-{n:07d}".encode()
            req = pb.PublishRequest(
                queue=QUEUE,
                messages=[pb.PublishMessage(value=value, idempotency_key=value.decode())],
            )
            try:
                self.stubs[k % len(self.stubs)].Publish(req, timeout=5, metadata=self.metadata)
            except grpc.RpcError as err:
                if err.code() in FATAL_CODES:
                    self.fatal = err
                    return
                self.errors += 1
                k += 1
                time.sleep(0.01)
                continue
            self.acked.append((time.monotonic(), value))
            n += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        for ch in self.channels:
            ch.close()
        if self.fatal is not None:
            raise RuntimeError(
                f"writer {self.tag}: {self.fatal.code().name}: {self.fatal.details()}"
            )


def stored(address: str, metadata: Metadata) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    with grpc.insecure_channel(address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for _ in range(100_000):
            r = stub.Fetch(
                pb.FetchRequest(queue=QUEUE, partition=0, offset=offset, max_messages=1000),
                timeout=10,
                metadata=metadata,
            )
            out.extend(rec.value for rec in r.records)
            if r.next_offset >= r.high_watermark:
                return out
            offset = r.next_offset
    raise RuntimeError("fetch did not finish")


def one_round(cluster: LocalCluster, mode: str, r: int) -> dict[str, float]:
    victim = leader_index(cluster)
    others = [a for i, a in enumerate(cluster.node_addresses, start=1) if i != victim]
    writer = Writer(others, f"{mode}{r}", auth_metadata(cluster.api_key()))
    writer.thread.start()
    time.sleep(BEFORE_S)
    stopped_at = time.monotonic()
    if mode == "sigterm":
        cluster.stop_node(victim)
    else:
        cluster.kill9(victim)
    exited_s = time.monotonic() - stopped_at
    time.sleep(AFTER_S)
    writer.close()
    times = [t for t, _ in writer.acked]
    around = [t for t in times if stopped_at - 1.0 <= t <= stopped_at + AFTER_S]
    gaps = [b - a for a, b in itertools.pairwise(around)]
    cluster.restart(victim)
    kept = stored(others[0], auth_metadata(cluster.api_key()))
    acked = [v for _, v in writer.acked]
    mine = [v for v in kept if v.startswith(f"{mode}{r}-".encode())]
    assert mine == acked, f"{mode} round {r}: {len(acked)} acked, {len(mine)} stored in order"
    return {
        "outage_ms": max(gaps) * 1000 if gaps else float("nan"),
        "exit_s": exited_s,
        "acked": float(len(acked)),
        "errors": float(writer.errors),
    }


def run(rounds: int, root: Path) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"sigterm": [], "kill9": []}
    with LocalCluster(root, nodes=3, base_port=free_base_port(), etcd_port=0) as cluster:
        with grpc.insecure_channel(cluster.node_addresses[0]) as ch:
            queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
                pb.CreateQueueRequest(
                    config=pb.QueueConfig(name=QUEUE, partitions=1, dedup_window="10m")
                ),
                timeout=10,
                metadata=auth_metadata(cluster.api_key()),
            )
        for r in range(rounds):
            for mode in ("sigterm", "kill9"):
                res = one_round(cluster, mode, r)
                results[mode].append(res)
                print(
                    f"{mode:8s} round {r}: write outage {res['outage_ms']:.0f} ms, "
                    f"{int(res['acked'])} acked, {int(res['errors'])} failed calls retried, "
                    f"stop took {res['exit_s']:.2f} s"
                )
    return results


def markdown(results: dict[str, list[dict[str, float]]]) -> str:
    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in results[mode])

    def worst(mode: str, key: str) -> float:
        return max(x[key] for x in results[mode])

    rounds = len(results["sigterm"])
    lines = [
        "## Restarting the leader: SIGTERM vs kill -9 (`python -m bench.failover`)",
        "",
        "etcd + 3 nodes on loopback, authentication on (every call carries the admin key); one "
        f"writer, one message per call, through the two other nodes; {rounds} rounds each, "
        "alternating. Write outage = the longest gap between two acknowledgements around the "
        "stop. Every acknowledged message was stored exactly once, in order, after each round "
        "(checked).",
        "",
        "| stop | write outage median | worst | node gone after |",
        "|---|---|---|---|",
    ]
    for mode, label in (("sigterm", "SIGTERM (graceful)"), ("kill9", "kill -9 (crash)")):
        lines.append(
            f"| {label} | {med(mode, 'outage_ms'):.0f} ms | {worst(mode, 'outage_ms'):.0f} ms | "
            f"{med(mode, 'exit_s'):.2f} s |"
        )
    ratio = med("kill9", "outage_ms") / max(1e-9, med("sigterm", "outage_ms"))
    lines += ["", f"A graceful stop interrupts writes {ratio:.1f}x less than a crash."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="")
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    rounds = max(1, min(args.rounds, ROUNDS_MAX))
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fluxmq-failover-"))
    try:
        results = run(rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    md = markdown(results)
    print(md)
    if args.write_results:
        write_section("failover", md)


if __name__ == "__main__":
    main()
