"""AdminService on a 3-replica cluster: every replica reports the same shard, and leadership can
be handed over on demand while writes continue."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2, queue_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.rpc_helpers import rich_error

pytestmark = pytest.mark.slow


def test_status_agrees_and_leadership_moves_on_request(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_leader()
        expected = cluster.raft[cluster.nodes.index(leader)]
        # A follower names the leader once its first append arrives (its link may still be in
        # the handshake when the leader is elected): wait, bounded, for every node to agree.
        deadline = time.monotonic() + 10
        infos = [cluster.status(n) for n in cluster.nodes]
        while {i.leader for i in infos if i} != {expected} and time.monotonic() < deadline:
            time.sleep(0.05)
            infos = [cluster.status(n) for n in cluster.nodes]
        assert all(i is not None for i in infos)
        assert {i.leader for i in infos if i} == {expected}
        assert all(sorted(i.members) == sorted(cluster.raft) for i in infos if i)
        assert sorted(i.role for i in infos if i) == ["follower", "follower", "leader"]

        target = next(a for a in cluster.raft if a != cluster.raft[cluster.nodes.index(leader)])
        with leader.channel() as ch:
            admin = admin_pb2_grpc.AdminServiceStub(ch)
            resp = admin.TransferLeadership(
                admin_pb2.TransferLeadershipRequest(shard_id="g1", target=target), timeout=10
            )
        assert resp.target == target and resp.leader == target
        new_leader = cluster.nodes[cluster.raft.index(target)]
        assert cluster.wait_leader() is new_leader

        with new_leader.channel() as ch:
            q = queue_pb2_grpc.QueueServiceStub(ch)
            q.CreateQueue(
                queue_pb2.CreateQueueRequest(config=queue_pb2.QueueConfig(name="after")),
                timeout=10,
            )
            q.Publish(
                queue_pb2.PublishRequest(
                    queue="after", messages=[queue_pb2.PublishMessage(value=b"x")]
                ),
                timeout=10,
            )
        assert len({i.digest for i in cluster.wait_converged()}) == 1

        # A follower cannot hand over what it does not hold.
        follower = next(n for n in cluster.nodes if n is not new_leader)
        with follower.channel() as ch, pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminServiceStub(ch).TransferLeadership(
                admin_pb2.TransferLeadershipRequest(shard_id="g1"), timeout=10
            )
        assert rich_error(err.value).reason == "NOT_LEADER"
    finally:
        cluster.stop()
