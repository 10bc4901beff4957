"""Leader addresses without etcd (issue 19, item 3): on a static-peer cluster (``--raft-listen``
and ``--peers`` only) every replica knows the leader's gRPC address (its new leader records it
in the shard's replicated state), so a follower forwards heartbeats to the leader, successful
answers name the leader in ``x-fluxmq-leader``, and NOT_LEADER names a gRPC address, never a
Raft one. One 3-node cluster for the module; the leadership transfer comes last."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from tests.integration.cluster import Cluster, started
from tests.integration.conftest import Node
from tests.integration.group_helpers import wait_for
from tests.integration.rpc_helpers import rich_error

pytestmark = pytest.mark.slow
FORWARDED = (("x-fluxmq-forwarded", "1"),)  # what a node sends: the callee never forwards it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with started(Cluster(tmp_path_factory.mktemp("static"))) as c:
        yield c


def leader_of(cluster: Cluster) -> Node:
    return cluster.wait_leader()


def followers(cluster: Cluster) -> list[Node]:
    leader = cluster.wait_leader()
    return [n for n in cluster.nodes if n is not leader]


def trailer_leader(call: grpc.Call) -> str | None:
    return dict(call.trailing_metadata() or ()).get("x-fluxmq-leader")


def join(stub: queue_pb2_grpc.QueueServiceStub, queue: str, group: str) -> pb.MemberAssignment:
    return stub.JoinGroup(
        pb.JoinGroupRequest(queue=queue, group=group, consumer_id="c1", session_timeout_ms=10_000),
        timeout=10,
    )


def heartbeat(
    stub: queue_pb2_grpc.QueueServiceStub, queue: str, group: str, m: pb.MemberAssignment
) -> tuple[pb.MemberAssignment, grpc.Call]:
    return stub.Heartbeat.with_call(
        pb.HeartbeatRequest(
            queue=queue, group=group, member_id=m.member_id, generation_id=m.generation_id
        ),
        timeout=10,
    )


def make_ordered_queue(cluster: Cluster, queue: str) -> None:
    with followers(cluster)[0].channel() as ch:
        s = queue_pb2_grpc.QueueServiceStub(ch)
        s.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=queue, partitions=2)), timeout=10
        )
        s.CreateGroup(
            pb.CreateGroupRequest(queue=queue, group="g", mode=pb.DELIVERY_MODE_ORDERED),
            timeout=10,
        )


def test_static_peer_follower_forwards_heartbeat_to_the_leader(cluster: Cluster) -> None:
    make_ordered_queue(cluster, "hb")
    # Every replica applied the queue, and before it the leader's address record: a follower
    # knows where to forward (right after the first election it may not yet, and answers a
    # retriable NOT_LEADER, which this test does not retry).
    cluster.wait_converged()
    leader = leader_of(cluster)
    follower = followers(cluster)[0]
    with follower.channel() as ch:
        s = queue_pb2_grpc.QueueServiceStub(ch)
        member = join(s, "hb", "g")
        assert sorted(member.assigned) == [0, 1]
        for _ in range(3):  # a session kept alive through a follower
            beat, call = heartbeat(s, "hb", "g", member)
            assert not beat.should_rejoin, beat.reason
            assert beat.member_id == member.member_id
            assert trailer_leader(call) == leader.address
    # The session lives on the leader: it answers the same member directly.
    with leader.channel() as ch:
        beat, _ = heartbeat(queue_pb2_grpc.QueueServiceStub(ch), "hb", "g", member)
        assert not beat.should_rejoin and sorted(beat.assigned) == [0, 1]


def test_static_peer_answers_name_the_leader_grpc_address(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    cluster.wait_converged()  # every replica knows the queue: this is about the trailer
    for node in cluster.nodes:
        with node.channel() as ch:
            s = queue_pb2_grpc.QueueServiceStub(ch)
            _, call = s.GetQueue.with_call(pb.GetQueueRequest(name="hb"), timeout=10)
            assert trailer_leader(call) == leader.address, node.address


def test_static_peer_not_leader_names_a_grpc_address(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    follower = followers(cluster)[0]
    with follower.channel() as ch:
        s = queue_pb2_grpc.QueueServiceStub(ch)
        member = join(s, "hb", "g")
        # A heartbeat already forwarded once is not forwarded again: the follower refuses it.
        with pytest.raises(grpc.RpcError) as err:
            s.Heartbeat(
                pb.HeartbeatRequest(
                    queue="hb", group="g", member_id=member.member_id, generation_id=1
                ),
                timeout=10,
                metadata=FORWARDED,
            )
        e = rich_error(err.value)
        assert e.code == grpc.StatusCode.UNAVAILABLE and e.reason == "NOT_LEADER"
        assert e.metadata["leader"] == leader.address
        assert leader.address in e.message
        # Shard operations too: the shard knows a Raft address, the answer gives the gRPC one.
        with pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminServiceStub(ch).TransferLeadership(
                admin_pb2.TransferLeadershipRequest(shard_id="g1"), timeout=10
            )
        e = rich_error(err.value)
        assert e.reason == "NOT_LEADER" and e.metadata["leader"] == leader.address
    assert all(r not in e.message for r in cluster.raft)


def test_static_peer_leader_address_follows_a_leadership_transfer(cluster: Cluster) -> None:
    old = leader_of(cluster)
    target = followers(cluster)[0]
    with old.channel() as ch:
        admin_pb2_grpc.AdminServiceStub(ch).TransferLeadership(
            admin_pb2.TransferLeadershipRequest(
                shard_id="g1", target=cluster.raft[cluster.nodes.index(target)]
            ),
            timeout=10,
        )
    assert cluster.wait_leader() is target

    def every_node_names(address: str) -> bool:
        for node in cluster.nodes:
            with node.channel() as ch:
                s = queue_pb2_grpc.QueueServiceStub(ch)
                try:
                    _, call = s.GetQueue.with_call(pb.GetQueueRequest(name="hb"), timeout=10)
                except grpc.RpcError:
                    return False  # electing
                if trailer_leader(call) != address:
                    return False
        return True

    # The new leader records its own address once it leads (the old record was the old one's).
    wait_for("every node to name the new leader", lambda: every_node_names(target.address))
    # The old leader, now a follower, forwards heartbeats to the new one.
    with old.channel() as ch:
        s = queue_pb2_grpc.QueueServiceStub(ch)
        member = join(s, "hb", "g")
        beat, call = heartbeat(s, "hb", "g", member)
        assert not beat.should_rejoin, beat.reason
        assert trailer_leader(call) == target.address
