"""A replica that lost its disk is not a voter until it is whole again (real processes, loopback).

A node restarted on an empty data directory remembers neither its log nor its vote. If it voted
at once, it and a replica that missed the latest commits would make a majority of three: they
would elect the stale one, and when the node that holds the commits came back its entries would
be truncated, acknowledged messages lost. The first test builds exactly that situation; the
second checks the ordinary case: a wiped node rejoins, is refilled, and ends identical.

A node's Raft runs in its shard process, a child of the front end: pausing or killing a node
here signals all its processes. The stale replica is paused, then killed while paused: resumed
instead, it would read what the leader had queued for it on the connection and not be stale."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2, queue_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow
PARTITIONS = 2
RETRIABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


def tree(node: Node) -> list[int]:
    """The node's processes: its shard process(es), where its Raft runs, then its front end."""
    assert node.proc is not None
    return [*node.shard_pids(), node.proc.pid]


def signal_tree(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill9(node: Node) -> None:
    """kill -9 of the node's every process (a stopped one too); back when all are gone."""
    pids = tree(node)
    signal_tree(pids, signal.SIGKILL)
    assert node.proc is not None
    node.proc.wait(10)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):
        assert time.monotonic() < deadline, f"{node.address}: processes outlived kill -9"
        time.sleep(0.02)


def create_queue(leader: Node, name: str) -> None:
    with leader.channel() as ch:
        queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
            queue_pb2.CreateQueueRequest(
                config=queue_pb2.QueueConfig(name=name, partitions=PARTITIONS, dedup_window="10m")
            ),
            timeout=10,
        )


def publish_one(
    nodes: list[Node], queue: str, value: bytes, attempts: int = 20, deadline_s: float = 15.0
) -> bool:
    """Publish ``value`` (its own idempotency key, so a retry is deduplicated) through ``nodes``
    in turn until acknowledged; at most ``attempts`` tries and ``deadline_s``. -> acknowledged."""
    req = queue_pb2.PublishRequest(
        queue=queue,
        messages=[queue_pb2.PublishMessage(value=value, idempotency_key=value.decode())],
        request_timeout_ms=3000,
    )
    deadline = time.monotonic() + deadline_s
    for attempt in range(attempts):
        if time.monotonic() >= deadline:
            return False
        node = nodes[attempt % len(nodes)]
        try:
            with node.channel() as ch:
                resp = queue_pb2_grpc.QueueServiceStub(ch).Publish(req, timeout=4)
        except grpc.RpcError as err:
            assert err.code() in RETRIABLE, (err.code(), err.details())
            time.sleep(0.05)
            continue
        assert len(resp.results) == 1
        return True
    return False


def stored_values(cluster: Cluster, node: Node, queue: str) -> Counter[bytes]:
    out: Counter[bytes] = Counter()
    for p in range(PARTITIONS):
        out.update(cluster.fetch_all(node, queue, p))
    return out


def wait_applied_its_commits(cluster: Cluster, leader: Node, timeout_s: float = 20.0) -> None:
    """The leader applied what it knows committed (reads from it see all of it)."""
    deadline = time.monotonic() + timeout_s
    info = None
    while time.monotonic() < deadline:
        info = cluster.status(leader)
        if info is not None and info.role == "leader" and info.applied_index >= info.commit_index:
            return
        time.sleep(0.1)
    raise AssertionError(f"{leader.address} did not apply its commits: {info}")


def check_all_there_once(stored: Counter[bytes], acked: list[bytes], where: str) -> None:
    lost = [v for v in acked if stored[v] == 0]
    doubled = [v for v in acked if stored[v] > 1]
    assert not lost, f"{where}: {len(lost)} of {len(acked)} acknowledged messages lost: {lost[:5]}"
    assert not doubled, f"{where}: {len(doubled)} acknowledged messages stored twice"


def test_commit_on_two_then_wipe_one_and_kill_the_other_loses_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    stalled: list[int] = []
    try:
        a = cluster.wait_leader()  # A leads and holds every commit
        b, c = [n for n in cluster.nodes if n is not a]
        create_queue(a, "ledger")
        cluster.wait_converged()  # B knows the queue: only the messages are missing from it
        b_before = cluster.status(b)
        assert b_before is not None

        # B stalls: 50 messages are committed on {A, C} only, one log entry each.
        stalled = tree(b)
        signal_tree(stalled, signal.SIGSTOP)
        acked: list[bytes] = []
        for i in range(50):
            value = f"ledger-{i:03d}".encode()
            if publish_one([a, c], "ledger", value):
                acked.append(value)
        assert len(acked) >= 40, f"only {len(acked)} of 50 acknowledged with B stalled"
        a_info = cluster.status(a)
        assert a_info is not None

        # C loses its disk, A dies, and B dies while stalled: what A had queued for B on the
        # connection (the 50 entries, already in B's socket buffer) dies with it, so B comes
        # back from its disk, clearly behind. C comes back empty under the same name.
        kill9(c)
        shutil.rmtree(c.data_dir)
        kill9(a)
        kill9(b)
        stalled = []
        for n in (b, c):
            n.spawn()
        for n in (b, c):
            n.wait_serving()

        # Only B (stale) and C (empty) are up: well past the election timeout (0.6-1.2 s).
        leaders_seen: list[str] = []
        b_applied = 0
        window_end = time.monotonic() + 7.0
        while time.monotonic() < window_end:
            for n in (b, c):
                info = cluster.status(n)
                if info is not None and info.role == "leader":
                    leaders_seen.append(n.address)
                if n is b and info is not None:
                    b_applied = max(b_applied, info.applied_index)
            time.sleep(0.2)
        # A write while only B and C are up may not be acknowledged; if it is, it must survive.
        window_value = b"window-000"
        window_acked = publish_one([b, c], "ledger", window_value, attempts=2, deadline_s=4)
        if window_acked:
            acked.append(window_value)
        print(
            f"A commit {a_info.commit_index}, B applied {b_before.applied_index} before the "
            f"stall, {b_applied} in the window; leaders seen in the window: "
            f"{sorted(set(leaders_seen))}; window write acknowledged: {window_acked}"
        )

        # A, which holds the commits, comes back: every acknowledged message is still there.
        a.start()
        leader = cluster.wait_leader(30)
        wait_applied_its_commits(cluster, leader)
        # First what the leader serves (what clients read), before anything else can fail.
        check_all_there_once(stored_values(cluster, leader, "ledger"), acked, "the leader")
        infos = cluster.wait_converged(30)
        assert len(infos) == 3 and len({i.digest for i in infos}) == 1
        for n in cluster.nodes:
            check_all_there_once(stored_values(cluster, n, "ledger"), acked, n.address)
        assert not leaders_seen, f"B (stale) and C (wiped) elected {set(leaders_seen)}"
        assert not window_acked, "a write was acknowledged by B (stale) and C (wiped) alone"
    finally:
        signal_tree(stalled, signal.SIGCONT)
        cluster.stop()


def test_a_node_restarted_with_an_empty_data_directory_rejoins_and_is_refilled(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_leader()
        create_queue(leader, "refill")
        acked = []
        for i in range(30):
            value = f"refill-{i:03d}".encode()
            assert publish_one(cluster.alive(), "refill", value), f"{value!r} not acknowledged"
            acked.append(value)
        follower = next(n for n in cluster.nodes if n is not cluster.wait_leader())
        follower.kill9()
        shutil.rmtree(follower.data_dir)
        follower.start()
        for i in range(30, 45):
            value = f"refill-{i:03d}".encode()
            assert publish_one(cluster.alive(), "refill", value), f"{value!r} not acknowledged"
            acked.append(value)
        infos = cluster.wait_converged(40)
        assert len(infos) == 3 and len({i.digest for i in infos}) == 1
        for n in cluster.nodes:
            stored = stored_values(cluster, n, "refill")
            check_all_there_once(stored, acked, n.address)
            assert sum(stored.values()) == len(acked), f"{n.address}: unexpected messages"
    finally:
        cluster.stop()
