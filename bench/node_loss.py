"""Issue 37's targets: time to full replication after a node loss, and publish throughput during
the move relative to before.

A 4-node dev cluster with etcd (``node_dead_after_ms`` short), one placed 3-replica group on
node1-3 holding a queue filled with ``--fill-mb`` of messages. Then three windows of publishing
(batches of 100 x 1 KiB, ``--concurrency`` publishers through node1): before; from the kill -9
of a follower of the group (node3, or node2 when node3 leads) until its replacement on node4
is whole (3 in-sync replicas, none on probation); and after. It prints the time from the kill
to the controller's new record (``node_dead_after_ms`` plus a pass), the catch-up time of the
new replica (the record to whole), and the publish rates.

    python -m bench.node_loss [--fill-mb 1024] [--dead-after-ms 10000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2, queue_pb2_grpc
from fluxmq.core.auth import new_key
from fluxmq.devcluster.launcher import ADMIN_KEY_FILE, LocalCluster
from fluxmq.metadata import ShardRecord

KEY = new_key("production")
BATCH = 100
VALUE = b"x" * 1024
GROUP, QUEUE = "gbench", "bench"
WAIT_S = 600.0  # longest wait for the record, then for the group to be whole


@dataclass
class Result:
    fill_mb: int
    dead_after_ms: int
    killed: str
    record_after_s: float  # kill -> the controller's new record
    whole_after_record_s: float  # new record -> 3 in-sync replicas, none on probation
    before_msgs_per_s: float
    during_msgs_per_s: float
    after_msgs_per_s: float

    @property
    def during_ratio(self) -> float:
        return self.during_msgs_per_s / self.before_msgs_per_s if self.before_msgs_per_s else 0.0


def md() -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {KEY}"),)


def shard(address: str, group: str) -> admin_pb2.ShardInfo | None:
    try:
        with grpc.insecure_channel(address) as ch:
            st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                admin_pb2.GetClusterStatusRequest(skip_digest=True), timeout=10, metadata=md()
            )
    except grpc.RpcError:
        return None
    return next((s for s in st.shards if s.shard_id == group), None)


def record(cluster: LocalCluster) -> ShardRecord | None:
    async def read() -> ShardRecord | None:
        store = cluster.metadata_store()
        try:
            v = await store.get_shard(GROUP)
            return None if v is None else v.value
        finally:
            await store.close()

    return asyncio.run(read())


class Publisher:
    """``concurrency`` threads publishing batches through one node; counts acknowledged
    messages (retriable errors are retried)."""

    def __init__(self, address: str, concurrency: int) -> None:
        self.address = address
        self.acked = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(concurrency)]

    def _run(self) -> None:
        req = queue_pb2.PublishRequest(
            queue=QUEUE, messages=[queue_pb2.PublishMessage(value=VALUE)] * BATCH
        )
        with grpc.insecure_channel(self.address) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            while not self._stop.is_set():
                try:
                    stub.Publish(req, timeout=20, metadata=md())
                except grpc.RpcError:
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self.acked += BATCH

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def rate(pub: Publisher, seconds: float) -> float:
    start, t0 = pub.acked, time.monotonic()
    time.sleep(seconds)
    return (pub.acked - start) / (time.monotonic() - t0)


def fill(address: str, mb: int) -> None:
    req = queue_pb2.PublishRequest(
        queue=QUEUE, messages=[queue_pb2.PublishMessage(value=VALUE)] * BATCH
    )
    batches = mb * 1024 // BATCH
    with grpc.insecure_channel(address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        done = 0
        while done < batches:
            try:
                stub.Publish(req, timeout=30, metadata=md())
                done += 1
            except grpc.RpcError:
                time.sleep(0.1)


def run(fill_mb: int, dead_after_ms: int, concurrency: int, window_s: float) -> Result:
    root = Path(tempfile.mkdtemp(prefix="fluxmq-node-loss-"))
    os.environ["FLUXMQ_NODE_DEAD_AFTER_MS"] = str(dead_after_ms)
    (root / ADMIN_KEY_FILE).write_text(KEY + "\n")
    cluster = LocalCluster(root, nodes=4, base_port=24_000, etcd_port=0)
    cluster.up()
    try:
        result = _measure(cluster, fill_mb, dead_after_ms, concurrency, window_s)
    except BaseException:
        print(f"failed; the cluster's logs are in {root}", flush=True)
        cluster.down(purge=False)
        raise
    cluster.down(purge=True)
    shutil.rmtree(root, ignore_errors=True)
    return result


def _measure(
    cluster: LocalCluster, fill_mb: int, dead_after_ms: int, concurrency: int, window_s: float
) -> Result:
    specs = cluster.specs()
    members = ("node1", "node2", "node3")
    ports = {m: specs[int(m[4:]) - 1].raft_port + 3 for m in members}

    async def create() -> None:
        store = cluster.metadata_store()
        try:
            await store.create_shard(ShardRecord(GROUP, members, ports, 3, 0))
        finally:
            await store.close()

    asyncio.run(create())
    first = cluster.node_addresses[0]
    deadline = time.monotonic() + 60
    while any(shard(cluster.node_addresses[i], GROUP) is None for i in range(3)):
        assert time.monotonic() < deadline, "the group did not start"
        time.sleep(0.2)
    with grpc.insecure_channel(first) as ch:
        queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
            queue_pb2.CreateQueueRequest(
                config=queue_pb2.QueueConfig(
                    name=QUEUE, partitions=4, replication=queue_pb2.Replication(group=GROUP)
                )
            ),
            timeout=30,
            metadata=md(),
        )
    t0 = time.monotonic()
    fill(first, fill_mb)
    print(f"filled {fill_mb} MB in {time.monotonic() - t0:.0f} s", flush=True)
    leader = next(
        m
        for m in members
        if (i := shard(cluster.node_addresses[int(m[4:]) - 1], GROUP)) and i.role == "leader"
    )
    victim = "node3" if leader != "node3" else "node2"
    pub = Publisher(first, concurrency)
    pub.start()
    try:
        before = rate(pub, window_s)
        start_count, t_kill = pub.acked, time.monotonic()
        cluster.kill9(int(victim[4:]))
        limit = t_kill + dead_after_ms / 1000 + WAIT_S
        while (rec := record(cluster)) is None or victim in rec.members:
            assert time.monotonic() < limit, f"no new record for {GROUP}: {rec}"
            time.sleep(0.2)
        t_record = time.monotonic()

        def whole() -> bool:
            infos = [shard(cluster.node_addresses[int(m[4:]) - 1], GROUP) for m in rec.members]
            leaders = [i for i in infos if i is not None and i.role == "leader"]
            return (
                all(i is not None and not i.on_probation for i in infos)
                and len(leaders) == 1
                and len(leaders[0].members) == 3
                and leaders[0].in_sync_replicas == 3
            )

        limit = t_record + WAIT_S
        while not whole():
            if time.monotonic() > limit:
                shown = {
                    m: shard(cluster.node_addresses[int(m[4:]) - 1], GROUP) for m in rec.members
                }
                raise AssertionError(f"{GROUP} not whole within {WAIT_S} s: {shown}")
            time.sleep(0.2)
        t_whole = time.monotonic()
        during = (pub.acked - start_count) / (t_whole - t_kill)
        after = rate(pub, window_s)
    finally:
        pub.stop()
    return Result(
        fill_mb,
        dead_after_ms,
        victim,
        round(t_record - t_kill, 2),
        round(t_whole - t_record, 2),
        round(before),
        round(during),
        round(after),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.node_loss", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--fill-mb", type=int, default=1024)
    ap.add_argument("--dead-after-ms", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    result = run(args.fill_mb, args.dead_after_ms, args.concurrency, args.window_s)
    row: dict[str, Any] = {**asdict(result), "during_ratio": round(result.during_ratio, 2)}
    print(json.dumps(row, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
