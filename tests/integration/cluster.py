"""Three (or more) `fluxmq serve` replicas of one shard on loopback, for tests and benchmarks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2, queue_pb2_grpc
from fluxmq.client import RetryPolicy
from fluxmq.core.auth import new_key
from tests.integration.conftest import Node, free_port

SECRET = "integration-test-secret-0123456789"
# SDK retries that ride out a restart, a hand-over or the election that may follow (~10 s).
PATIENT = RetryPolicy(max_attempts=40, initial_backoff_s=0.05, max_backoff_s=0.5)


class Cluster:
    """With ``--etcd`` among ``extra`` the cluster authenticates (the default in cluster mode):
    a production admin key is bootstrapped from a file, and ``channel()`` of every node, like
    ``metadata``, presents it. Without etcd there is nowhere to keep keys, so the cluster runs
    with ``--auth off``, as an operator of a static-peer cluster must say explicitly."""

    def __init__(self, root: Path, n: int = 3, *extra: str, secret: str = SECRET) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.nodes: list[Node] = []
        self.api_key = ""
        if "--auth" not in extra:
            if "--etcd" in extra:
                self.api_key = new_key("production")
                key_file = root / "admin.key"
                key_file.write_text(self.api_key + "\n")
                extra = (*extra, "--auth-bootstrap-key-file", str(key_file))
            else:
                extra = (*extra, "--auth", "off")
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()
        )
        for i, addr in enumerate(self.raft):
            peers = ",".join(a for a in self.raft if a != addr)
            node = Node(root / f"n{i}", "--raft-listen", addr, "--peers", peers, *extra)
            node.env = {**os.environ, "FLUXMQ_CLUSTER_SECRET": secret}
            node.api_key = self.api_key
            self.nodes.append(node)

    def start(self) -> None:
        try:
            for n in self.nodes:
                n.start()
            self.wait_leader()
        except BaseException:
            self.stop()  # no node outlives a failed start
            raise

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.stop()

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def status(self, node: Node) -> admin_pb2.ShardInfo | None:
        try:
            with node.channel() as ch:
                st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                    admin_pb2.GetClusterStatusRequest(), timeout=5, metadata=self.metadata
                )
        except grpc.RpcError:
            return None
        return st.shards[0] if st.shards else None

    def wait_leader(self, timeout_s: float = 20.0) -> Node:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, node in enumerate(self.nodes):
                if node not in self.alive():
                    continue
                info = self.status(node)
                if info is not None and info.role == "leader":
                    assert info.leader == self.raft[i]
                    return node
            time.sleep(0.05)
        raise AssertionError("no leader elected")

    def wait_converged(self, timeout_s: float = 30.0) -> list[admin_pb2.ShardInfo]:
        """Every live replica applied the same index; returns their infos."""
        deadline = time.monotonic() + timeout_s
        infos: list[admin_pb2.ShardInfo | None] = []
        while time.monotonic() < deadline:
            infos = [self.status(n) for n in self.alive()]
            if all(i is not None for i in infos) and (
                len({(i.applied_index, i.digest) for i in infos if i is not None}) == 1
            ):
                return [i for i in infos if i is not None]
            time.sleep(0.1)
        raise AssertionError(f"replicas did not converge: {infos}")

    def fetch_all(self, node: Node, queue: str, partition: int = 0) -> list[bytes]:
        out: list[bytes] = []
        offset = 0
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for _ in range(100_000):
                r = stub.Fetch(
                    queue_pb2.FetchRequest(
                        queue=queue, partition=partition, offset=offset, max_messages=1000
                    ),
                    timeout=10,
                )
                out.extend(rec.value for rec in r.records)
                if r.next_offset >= r.high_watermark:
                    return out
                offset = r.next_offset
        raise AssertionError("fetch did not finish")


@contextmanager
def started(cluster: Cluster) -> Iterator[Cluster]:
    """``cluster`` started (with a leader) for the block, stopped after it however it ends."""
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
