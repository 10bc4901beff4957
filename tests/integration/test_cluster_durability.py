"""A 3-replica cluster of real processes on loopback: acknowledged writes survive kill -9 of the
leader, of a follower, and of every node at once; lagging replicas catch up by log and by
snapshot; replicas end with identical state (digests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2, queue_pb2_grpc
from storage import unsynced_marker
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow
BATCH = 100


def create_queue(cluster: Cluster, name: str) -> None:
    node = cluster.wait_leader()
    with node.channel() as ch:
        queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
            queue_pb2.CreateQueueRequest(
                config=queue_pb2.QueueConfig(name=name, partitions=1, dedup_window="10m")
            ),
            timeout=10,
        )


def publish_batches(
    cluster: Cluster,
    queue: str,
    batches: int,
    on_batch: Callable[[int], None] = lambda _i: None,
    deadline_s: float = 120.0,
    first: int = 0,
) -> tuple[list[bytes], int]:
    """Publish ``batches`` batches one after the other, each retried (same idempotency keys, any
    live node) until acknowledged. -> (acknowledged values in order, retries)."""
    acked: list[bytes] = []
    retries = 0
    deadline = time.monotonic() + deadline_s
    for b in range(first, first + batches):
        on_batch(b)
        values = [f"m{b * BATCH + j:06d}".encode() for j in range(BATCH)]
        req = queue_pb2.PublishRequest(
            queue=queue,
            messages=[
                queue_pb2.PublishMessage(value=v, idempotency_key=v.decode()) for v in values
            ],
            request_timeout_ms=5000,
        )
        attempt = 0
        while True:
            assert time.monotonic() < deadline, f"batch {b} not acknowledged in time"
            alive = cluster.alive()
            node = alive[(b + attempt) % len(alive)]
            try:
                with node.channel() as ch:
                    resp = queue_pb2_grpc.QueueServiceStub(ch).Publish(req, timeout=6)
            except grpc.RpcError as err:
                assert err.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ), (err.code(), err.details())
                attempt += 1
                retries += 1
                time.sleep(0.05)
                continue
            assert len(resp.results) == BATCH
            acked.extend(values)
            break
    return acked, retries


def check_replicas(cluster: Cluster, queue: str, acked: list[bytes]) -> None:
    infos = cluster.wait_converged()
    assert len({i.digest for i in infos}) == 1
    for node in cluster.nodes:
        stored = cluster.fetch_all(node, queue)
        # Exactly once and in acknowledgement order: retried batches were deduplicated.
        assert stored == acked, f"{node.address}: {len(stored)} stored vs {len(acked)} acknowledged"


def leader_index(cluster: Cluster) -> int:
    return cluster.nodes.index(cluster.wait_leader())


def test_leader_kill9_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        create_queue(cluster, "orders")
        killed: list[Node] = []

        def chaos(b: int) -> None:
            if b == 80:
                victim = cluster.nodes[leader_index(cluster)]
                victim.kill9()
                killed.append(victim)
            if b == 140:
                killed[0].start()

        acked, retries = publish_batches(cluster, "orders", 200, chaos)
        assert len(acked) == 20_000
        print(f"retries after the leader's kill -9: {retries}")
        check_replicas(cluster, "orders", acked)
    finally:
        cluster.stop()


def test_kill9_of_every_node_at_once_loses_nothing_acknowledged(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        create_queue(cluster, "events")
        acked, _ = publish_batches(cluster, "events", 30)
        for n in cluster.nodes:
            n.kill9()
        for n in cluster.nodes:
            n.start()
        cluster.wait_leader()
        more, _ = publish_batches(cluster, "events", 5, first=30)
        check_replicas(cluster, "events", acked + more)
    finally:
        cluster.stop()


def forge_machine_crash(node: Node) -> list[Path]:
    """What a power loss can leave of a node's state stores, which commit without fsync: torn
    files, marked unsynced by a boot that is over. -> the stores torn."""
    torn = []
    for marker in node.data_dir.rglob(unsynced_marker.MARKER_NAME):
        marker.write_text("00000000-0000-0000-0000-000000000000")
        data = marker.parent / "data.mdb"
        size = data.stat().st_size
        with open(data, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xde\xad" * 2048)  # pages written half-way
        torn.append(marker.parent)
    return torn


def test_a_power_loss_of_every_node_loses_nothing_acknowledged_the_log_rebuilds_the_state(
    tmp_path: Path,
) -> None:
    # Few entries per snapshot: the rebuild needs the snapshot and the journal after it.
    cluster = Cluster(tmp_path, 3, "--raft-compaction-entries", "20")
    cluster.start()
    try:
        create_queue(cluster, "events")
        acked, _ = publish_batches(cluster, "events", 60)
        for n in cluster.nodes:
            n.kill9()
        for n in cluster.nodes:
            assert forge_machine_crash(n), f"{n.address}: no state store commits unsynced"
        for n in cluster.nodes:
            n.start()
        cluster.wait_leader()
        more, _ = publish_batches(cluster, "events", 5, first=60)
        check_replicas(cluster, "events", acked + more)
        for n in cluster.nodes:
            log = n.log_path.read_text()
            assert "rebuilt from the Raft snapshot and journal" in log
            assert "installed the snapshot" in log
    finally:
        cluster.stop()


def test_lagging_follower_catches_up_by_log_and_past_compaction_by_snapshot(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, 3, "--raft-compaction-entries", "40")
    cluster.start()
    try:
        create_queue(cluster, "logs")
        acked, _ = publish_batches(cluster, "logs", 5)
        follower = next(n for n in cluster.nodes if n is not cluster.wait_leader())
        # Short outage: the leader still has the entries it missed.
        follower.stop()
        more, _ = publish_batches(cluster, "logs", 10, first=5)
        follower.start()
        check_replicas(cluster, "logs", acked + more)
        # Long outage: far more entries than the compaction threshold, one batch per entry.
        follower.stop()
        later, _ = publish_batches(cluster, "logs", 150, first=15)
        follower.start()
        check_replicas(cluster, "logs", acked + more + later)
        snapshot = follower.data_dir / "raft" / "g1" / "snapshot"
        assert snapshot.exists(), "the follower was not brought back by a snapshot"
        assert "installed the snapshot" in follower.log_path.read_text()
    finally:
        cluster.stop()


def test_writes_resume_after_the_leader_dies_under_load(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        create_queue(cluster, "load")
        times: dict[str, float] = {}

        def chaos(b: int) -> None:
            if b == 20:
                cluster.nodes[leader_index(cluster)].kill9()
                times["killed"] = time.monotonic()
            if b == 21:
                times["resumed"] = time.monotonic()

        # Batch 20 is the first published after the kill; its acknowledgement ends the outage.
        acked, _ = publish_batches(cluster, "load", 40, chaos)
        outage_s = times["resumed"] - times["killed"]
        print(f"writes resumed {outage_s:.2f} s after the leader's kill -9")
        assert len(acked) == 4000
    finally:
        cluster.stop()
