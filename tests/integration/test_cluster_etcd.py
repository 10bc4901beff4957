"""Three nodes and a real etcd: one cluster a client can use through any node (issue 5).

Each test starts etcd on loopback and three `fluxmq serve` replicas registered in it."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.group_helpers import (
    MemberProcess,
    check_single_owner,
    describe,
    read_events,
    settled,
    wait_for,
)
from tests.integration.rpc_helpers import rich_error

pytestmark = pytest.mark.slow
NODE_TTL_MS = 2000


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3, "--etcd", etcd.endpoint, "--node-ttl-ms", str(NODE_TTL_MS))
    for i, node in enumerate(c.nodes):
        node.extra = (*node.extra, "--node-id", f"n{i}")
    c.start()
    yield c
    c.stop()


def status(node: Node) -> admin_pb2.ClusterStatus:
    with node.channel() as ch:
        return admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(), timeout=10
        )


def metric(node: Node, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
        for family in text_string_to_metric_families(r.read().decode()):
            for sample in family.samples:
                if sample.name == name and not sample.labels:
                    return float(sample.value)
    raise AssertionError(f"{name} not exposed")


def readyz(node: Node) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/readyz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def live_nodes(node: Node) -> list[str]:
    return [n.node_id for n in status(node).nodes]


def stub(node: Node) -> tuple[grpc.Channel, queue_pb2_grpc.QueueServiceStub]:
    ch = node.channel()
    return ch, queue_pb2_grpc.QueueServiceStub(ch)


def test_create_on_one_node_publish_on_another_consume_on_a_third(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    wait_for("every node registered", lambda: live_nodes(n1) == ["n0", "n1", "n2"])
    for n in cluster.nodes:  # joined: registered, shard led and caught up
        wait_for("ready", lambda n=n: readyz(n) == 200, timeout_s=15)
        assert metric(n, "fluxmq_etcd_session_up") == 1
    ch1, s1 = stub(n1)
    ch2, s2 = stub(n2)
    ch3, s3 = stub(n3)
    with ch1, ch2, ch3:
        s1.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="orders", partitions=2)))
        s1.CreateGroup(pb.CreateGroupRequest(queue="orders", group="g"))
        sent = [b"m%d" % i for i in range(50)]
        resp, call = s2.Publish.with_call(
            pb.PublishRequest(queue="orders", messages=[pb.PublishMessage(value=v) for v in sent]),
            timeout=10,
        )
        assert len(resp.results) == 50
        leader = dict(call.trailing_metadata())["x-fluxmq-leader"]
        assert leader in {n.address for n in cluster.nodes}  # the SDK can go there directly
        got: list[bytes] = []
        for _ in range(200):
            r = s3.Lease(
                pb.LeaseRequest(
                    queue="orders", group="g", consumer_id="c", max_messages=100, wait_ms=200
                ),
                timeout=10,
            )
            got += [m.record.value for m in r.messages]
            if r.messages:
                s3.Ack(
                    pb.AckRequest(
                        queue="orders", group="g", receipts=[m.receipt for m in r.messages]
                    )
                )
            if len(got) >= 50:
                break
        assert sorted(got) == sorted(sent)
    # Every node tells the same story: the same live nodes, the same leader, the same state.
    infos = cluster.wait_converged()
    assert len({(i.leader, i.term) for i in infos}) == 1
    statuses = [status(n) for n in cluster.nodes]
    assert all([x.node_id for x in st.nodes] == ["n0", "n1", "n2"] for st in statuses)
    assert {st.node_id for st in statuses} == {"n0", "n1", "n2"}
    groups = [[(g.group_id, list(g.members)) for g in st.groups] for st in statuses]
    assert groups[0] == groups[1] == groups[2] == [("g1", ["n0", "n1", "n2"])]


def test_two_nodes_racing_to_create_a_queue_exactly_one_wins(cluster: Cluster) -> None:
    for round_ in range(5):
        name = f"race{round_}"
        outcomes: list[str] = []

        def create(node: Node, name: str = name, outcomes: list[str] = outcomes) -> None:
            with node.channel() as ch:
                try:
                    queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
                        pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), timeout=10
                    )
                    outcomes.append("created")
                except grpc.RpcError as err:
                    outcomes.append(rich_error(err).reason)

        threads = [threading.Thread(target=create, args=(n,)) for n in cluster.nodes[:2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == ["QUEUE_EXISTS", "created"], (round_, outcomes)


def test_killed_node_leaves_the_directory_and_rejoins_after_restart(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    victim = leader  # the hardest case: the shard must elect a new leader
    others = [n for n in cluster.nodes if n is not victim]
    ch, s = stub(others[0])
    with ch:
        s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="jobs")))
        victim.kill9()
        took = wait_for(
            "the dead node's key to expire",
            lambda: len(live_nodes(others[0])) == 2,
            timeout_s=NODE_TTL_MS / 1000 + 15,
        )
        assert took > 0
        cluster.wait_leader()
        for node in others:  # clients keep working through the others
            ch2, s2 = stub(node)
            with ch2:
                s2.Publish(
                    pb.PublishRequest(queue="jobs", messages=[pb.PublishMessage(value=b"x")]),
                    timeout=15,
                )
        victim.start()
        wait_for("the node to register again", lambda: len(live_nodes(others[0])) == 3)
    infos = cluster.wait_converged()
    assert len({i.applied_index for i in infos}) == 1
    assert cluster.fetch_all(victim, "jobs") == [b"x", b"x"]


def test_etcd_unavailable_keeps_the_data_plane_and_refuses_metadata_changes(
    cluster: Cluster, etcd: EtcdServer
) -> None:
    n1 = cluster.nodes[0]
    ch, s = stub(n1)
    with ch:
        s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="steady")))
        s.CreateGroup(pb.CreateGroupRequest(queue="steady", group="g"))
        # Ready first (a new cluster's first election waits for its replicas to leave
        # probation): what is checked below is that it stays ready.
        wait_for("the node to be ready", lambda: readyz(n1) == 200, timeout_s=30)
        etcd.stop()
        s.Publish(
            pb.PublishRequest(queue="steady", messages=[pb.PublishMessage(value=b"during")]),
            timeout=15,
        )
        r = s.Lease(pb.LeaseRequest(queue="steady", group="g", consumer_id="c", wait_ms=2000))
        assert [m.record.value for m in r.messages] == [b"during"]
        s.Ack(pb.AckRequest(queue="steady", group="g", receipts=[r.messages[0].receipt]))
        with pytest.raises(grpc.RpcError) as exc:
            s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="new")), timeout=15)
        err = rich_error(exc.value)
        assert err.code == grpc.StatusCode.UNAVAILABLE
        assert err.reason == "METADATA_UNAVAILABLE" and err.metadata["retriable"] == "true"
        assert "existing queues keep working" in err.message
        with pytest.raises(grpc.RpcError) as exc:
            s.DeleteQueue(pb.DeleteQueueRequest(name="steady"), timeout=15)
        assert rich_error(exc.value).reason == "METADATA_UNAVAILABLE"
        assert status(n1).metadata_error  # the status says why
        # The session is down, but the node stays ready: the data plane works without etcd.
        wait_for(
            "the etcd session gauge to drop",
            lambda: metric(n1, "fluxmq_etcd_session_up") == 0,
            timeout_s=15,
        )
        assert readyz(n1) == 200
        etcd.start()

        def created() -> bool:
            try:
                s.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="new")), timeout=5)
                return True
            except grpc.RpcError as err:
                assert rich_error(err).reason == "METADATA_UNAVAILABLE"
                return False

        wait_for("metadata changes to work again", created, timeout_s=30, every_s=0.5)
        wait_for("the status to recover", lambda: not status(n1).metadata_error, timeout_s=15)
        wait_for("the session", lambda: metric(n1, "fluxmq_etcd_session_up") == 1, timeout_s=15)


def test_leader_failover_keeps_consumer_groups(cluster: Cluster, tmp_path: Path) -> None:
    queue, parts = "ordered", 4
    ch, s = stub(cluster.nodes[0])
    with ch:
        s.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=queue, partitions=parts)),
            timeout=10,
        )
        s.CreateGroup(pb.CreateGroupRequest(queue=queue, group="g", mode=pb.DELIVERY_MODE_ORDERED))
        msgs = [pb.PublishMessage(value=b"%d" % i, partition=i % parts) for i in range(400)]
        s.Publish(pb.PublishRequest(queue=queue, messages=msgs), timeout=10)
    events = tmp_path / "events.jsonl"
    addresses = [n.address for n in cluster.nodes]
    members = [
        MemberProcess(
            addresses, queue, "g", f"c{i}", events, session_ms=4000, api_key=cluster.api_key
        )
        for i in range(2)
    ]
    try:
        follower = next(n for n in cluster.nodes if n is not cluster.wait_leader())
        ch2, s2 = stub(follower)
        with ch2:
            wait_for(
                "2 members, 2 partitions each", lambda: settled(describe(s2, queue, "g"), 2, parts)
            )
            before = describe(s2, queue, "g")
            cluster.wait_leader().kill9()
            cluster.wait_leader()
            # Same members, same generations: the new leader restored the group from the log
            # and gave every member a session to heartbeat in.
            time.sleep(1.0)
            after = describe(s2, queue, "g")
            assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
            wait_for(
                "members to keep their session",
                lambda: settled(describe(s2, queue, "g"), 2, parts),
                timeout_s=20,
            )
            final = describe(s2, queue, "g")
            assert [m.member_id for m in final.members] == [m.member_id for m in before.members]
    finally:
        for m in members:
            m.stop()
    check_single_owner(read_events(events), {})
