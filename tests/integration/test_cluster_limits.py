"""Limits are the same whatever node a client talks to (issue 20, item 12), on a real 3-node
cluster with etcd: a Publish of several MiB (messages may be 16 MiB) is replicated as a single
node stores it, not refused at 1 MiB; a Fetch answer over gRPC's default 4 MiB comes back through
a node that does not host the queue, as it does from one that does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.devcluster.launcher import LocalCluster
from fluxmq.metadata import ShardRecord
from tests.integration.group_helpers import wait_for
from tests.integration.test_placement import KEY, launched, metadata, shards_of

pytestmark = pytest.mark.slow
BIG_BYTES = 5_400_000  # the report's 5.4 MB: over 1 MiB (a Raft frame) and 4 MiB (gRPC default)
MESSAGE_BYTES_MAX = 16 * 1024 * 1024
CALL_TIMEOUT_S = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from launched(tmp_path / "c")


class _Authorized(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {KEY}")]
        return continuation(details._replace(metadata=metadata), request)


def stub(address: str) -> tuple[grpc.Channel, queue_pb2_grpc.QueueServiceStub]:
    """A client that receives what a node may send (64 MiB), as the SDK does."""
    ch = grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    )
    intercepted = grpc.intercept_channel(ch, _Authorized())
    return ch, queue_pb2_grpc.QueueServiceStub(intercepted)  # type: ignore[no-untyped-call]


def big_queue(name: str, factor: int) -> pb.CreateQueueRequest:
    config = pb.QueueConfig(
        name=name, max_message_bytes=MESSAGE_BYTES_MAX, replication=pb.Replication(factor=factor)
    )
    return pb.CreateQueueRequest(config=config)


def test_a_publish_of_several_mib_is_replicated_and_read_back_through_any_node(
    cluster: LocalCluster,
) -> None:
    a1, a2, _ = cluster.node_addresses
    ch1, s1 = stub(a1)
    ch2, s2 = stub(a2)
    with ch1, ch2:
        # Replicated on all three: one Raft entry of about 2 x 5.4 MB.
        s1.CreateQueue(big_queue("wide", 3), timeout=CALL_TIMEOUT_S)
        values = [b"a" * BIG_BYTES, b"b" * BIG_BYTES]
        published = s2.Publish(
            pb.PublishRequest(queue="wide", messages=[pb.PublishMessage(value=v) for v in values]),
            timeout=CALL_TIMEOUT_S,
        )
        assert [r.offset for r in published.results] == [0, 1]
        fetch = pb.FetchRequest(queue="wide", partition=0, max_bytes=MESSAGE_BYTES_MAX)
        for s in (s1, s2):  # a replica serves what it has applied: it may be a moment behind

            def applied(s: queue_pb2_grpc.QueueServiceStub = s) -> bool:
                return bool(s.Fetch(fetch, timeout=CALL_TIMEOUT_S).records)

            wait_for("the replica to apply", applied)
            got = s.Fetch(fetch, timeout=CALL_TIMEOUT_S)
            assert [r.value for r in got.records] == values


def test_a_fetch_over_4_mib_through_a_node_outside_the_group_is_answered(
    cluster: LocalCluster,
) -> None:
    a1, _, a3 = cluster.node_addresses
    host = "node1"
    port = cluster.specs()[0].ports[2] + 5
    metadata(cluster, "create_shard", ShardRecord("solo", (host,), {host: port}, 1, 0))
    wait_for("node1 to run the group", lambda: "solo" in shards_of(a1))
    ch1, s1 = stub(a1)
    ch3, s3 = stub(a3)
    with ch1, ch3:
        request = big_queue("far", 1)
        request.config.replication.group = "solo"
        s1.CreateQueue(request, timeout=CALL_TIMEOUT_S)
        assert "solo" not in shards_of(a3)
        value = b"z" * BIG_BYTES
        s3.Publish(  # forwarded: a 5.4 MB request from node3 to node1
            pb.PublishRequest(queue="far", messages=[pb.PublishMessage(value=value)]),
            timeout=CALL_TIMEOUT_S,
        )
        fetch = pb.FetchRequest(queue="far", partition=0, max_bytes=MESSAGE_BYTES_MAX)
        direct = s1.Fetch(fetch, timeout=CALL_TIMEOUT_S)
        try:
            relayed = s3.Fetch(fetch, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            pytest.fail(f"through node3: {err.code()} {err.details()}")  # type: ignore[attr-defined]
        assert relayed.records[0].value == direct.records[0].value == value
