"""Per-queue replication policy: factor must fit the shard, min_in_sync refuses writes while too
few replicas are in sync, ack_timeout answers UNAVAILABLE without reporting unconfirmed writes as
written, async mode acknowledges at the leader's append."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error

pytestmark = pytest.mark.slow


def stub_of(node: Node) -> queue_pb2_grpc.QueueServiceStub:
    return queue_pb2_grpc.QueueServiceStub(grpc.insecure_channel(node.address))


def create(stub: queue_pb2_grpc.QueueServiceStub, name: str, **rep: object) -> pb.Queue:
    cfg = pb.QueueConfig(name=name, replication=pb.Replication(**rep))  # type: ignore[arg-type]
    return stub.CreateQueue(pb.CreateQueueRequest(config=cfg), timeout=10)


def publish(stub: queue_pb2_grpc.QueueServiceStub, queue: str, key: str) -> pb.PublishResponse:
    msg = pb.PublishMessage(value=key.encode(), idempotency_key=key)
    return stub.Publish(pb.PublishRequest(queue=queue, messages=[msg]), timeout=15)


def test_replication_policy_is_checked_against_a_single_node(
    stub: queue_pb2_grpc.QueueServiceStub,
) -> None:
    q = create(stub, "one", factor=1)
    assert q.config.replication.mode == pb.REPLICATION_MODE_SYNC
    assert q.config.replication.ack_timeout == "10s"
    with pytest.raises(grpc.RpcError) as e:
        create(stub, "three", factor=3)
    err = rich_error(e.value)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.reason == "REPLICATION_UNSATISFIABLE"
    assert err.fields == ["config.replication.factor"]
    # One replica: its append is its commit, so an async queue answers with offsets.
    create(stub, "async", mode=pb.REPLICATION_MODE_ASYNC)
    r = publish(stub, "async", "a1")
    assert not r.results[0].pending
    with pytest.raises(grpc.RpcError) as e:
        create(stub, "bad-mode", mode=7)
    err = rich_error(e.value)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.fields == ["config.replication.mode"]
    with pytest.raises(grpc.RpcError) as e:
        create(stub, "slow", ack_timeout="1h")
    assert rich_error(e.value).fields == ["config.replication.ack_timeout"]
    with pytest.raises(grpc.RpcError) as e:
        create(stub, "isr", factor=1, min_in_sync=2)
    assert rich_error(e.value).fields == ["config.replication.min_in_sync"]


def test_min_in_sync_refuses_writes_while_a_replica_is_down_and_writes_nothing(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_leader()
        stub = stub_of(leader)
        with pytest.raises(grpc.RpcError) as e:
            create(stub, "five", factor=5)
        assert rich_error(e.value).reason == "REPLICATION_UNSATISFIABLE"
        create(stub, "strict", factor=3, min_in_sync=3)
        create(stub, "majority", factor=3)
        # A replica that started last may still be catching up when the leader is elected:
        # until all three are in sync, "strict" refuses (retriable) and writes nothing.
        _until_accepted(stub, "strict", "a", bound_s=20)
        follower = next(n for n in cluster.nodes if n is not leader)
        follower.kill9()
        deadline = time.monotonic() + 10
        refused = None
        while time.monotonic() < deadline and refused is None:
            try:
                publish(stub, "strict", f"b{time.monotonic()}")
            except grpc.RpcError as err:
                refused = rich_error(err)
            time.sleep(0.05)
        # Writes published before the status caught up were acknowledged by a majority; from
        # the refusal on, nothing more is written.
        assert refused is not None and refused.reason == "NOT_ENOUGH_REPLICAS"
        assert refused.code == grpc.StatusCode.UNAVAILABLE and refused.retry_delay_ms
        hw = stub.GetQueueStats(pb.GetQueueStatsRequest(name="strict"), timeout=5)
        with pytest.raises(grpc.RpcError):
            publish(stub, "strict", "refused")
        assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="strict"), timeout=5) == hw
        publish(stub, "majority", "still-fine")  # 2 of 3 is a majority
        follower.start()
        _until_accepted(stub, "strict", "after", bound_s=20)
    finally:
        cluster.stop()


def _until_accepted(stub: Any, queue: str, value: str, *, bound_s: float) -> None:
    """Publish until the queue takes it, refused only NOT_ENOUGH_REPLICAS meanwhile."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            publish(stub, queue, value)
            return
        except grpc.RpcError as err:
            assert rich_error(err).reason == "NOT_ENOUGH_REPLICAS", err
            assert time.monotonic() < deadline, err
            time.sleep(0.1)


def test_ack_timeout_is_unavailable_and_a_retry_writes_exactly_once(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_leader()
        stub = stub_of(leader)
        create(stub, "t", ack_timeout="300ms")
        for n in cluster.nodes:
            if n is not leader:
                n.kill9()
        with pytest.raises(grpc.RpcError) as e:
            publish(stub, "t", "k1")
        err = rich_error(e.value)
        assert err.code == grpc.StatusCode.UNAVAILABLE
        assert err.reason in ("REPLICATION_TIMEOUT", "NOT_LEADER")
        for n in cluster.nodes:
            if n is not leader:
                n.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                node = cluster.wait_leader()
                publish(stub_of(node), "t", "k1")
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        stored = cluster.fetch_all(cluster.wait_leader(), "t")
        assert stored == [b"k1"]
    finally:
        cluster.stop()


def test_async_mode_acknowledges_at_the_leaders_append_and_replicates(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_leader()
        stub = stub_of(leader)
        q = create(stub, "fast", mode=pb.REPLICATION_MODE_ASYNC)
        assert q.config.replication.mode == pb.REPLICATION_MODE_ASYNC
        pending = 0
        for i in range(50):
            r = publish(stub, "fast", f"k{i}")
            pending += r.results[0].pending
        # Acknowledged at the append: no offset yet (a few may have waited for the commit
        # when a round ended without the append being confirmed).
        assert pending > 0
        follower = next(n for n in cluster.nodes if n is not leader)
        r = publish(stub_of(follower), "fast", "via-follower")
        assert not r.results[0].pending  # a follower cannot see the leader's append: SYNC
        cluster.wait_converged()
        stored = cluster.fetch_all(leader, "fast")
        assert stored == [f"k{i}".encode() for i in range(50)] + [b"via-follower"]
    finally:
        cluster.stop()
