"""Placement over several replication groups (issue 5): CreateQueue picks the explicit group,
else the least loaded group of the queue's factor, else provisions a new one on distinct nodes;
any node serves any queue, forwarding to a node of the queue's group (real etcd, real nodes)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import new_key
from fluxmq.devcluster.launcher import ADMIN_KEY_FILE, LocalCluster
from fluxmq.metadata import ShardRecord
from tests.integration.conftest import authorized_channel
from tests.integration.group_helpers import wait_for
from tests.integration.rpc_helpers import rich_error
from tests.integration.test_cluster_cli import free_port_range

pytestmark = pytest.mark.slow
KEY = new_key("production")  # every test's cluster bootstraps this admin key


def launched(root: Path) -> Iterator[LocalCluster]:
    """Three nodes and their etcd as ``fluxmqctl cluster up`` starts them, in ``root``,
    bootstrapping KEY; taken down (data kept) once the caller is done."""
    root.mkdir()
    (root / ADMIN_KEY_FILE).write_text(KEY + "\n")
    c = LocalCluster(root, nodes=3, base_port=free_port_range(), etcd_port=0)
    c.up()
    try:
        yield c
    finally:
        c.down(purge=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from launched(tmp_path / "c")


def metadata(c: LocalCluster, call: str, *args: object) -> object:
    async def run() -> object:
        store = c.metadata_store()
        try:
            return await getattr(store, call)(*args)
        finally:
            await store.close()

    return asyncio.run(run())


def stub(address: str) -> tuple[grpc.Channel, queue_pb2_grpc.QueueServiceStub]:
    ch = authorized_channel(address, KEY)
    return ch, queue_pb2_grpc.QueueServiceStub(ch)


def shards_of(address: str) -> set[str]:
    with authorized_channel(address, KEY) as ch:
        st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(), timeout=10
        )
    return {s.shard_id for s in st.shards}


def groups_seen_by(address: str) -> set[str]:
    with authorized_channel(address, KEY) as ch:
        st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(), timeout=10
        )
    return {g.group_id for g in st.groups}


def create(s: queue_pb2_grpc.QueueServiceStub, name: str, **replication: object) -> pb.Queue:
    config = pb.QueueConfig(name=name, replication=pb.Replication(**replication))  # type: ignore[arg-type]
    return s.CreateQueue(pb.CreateQueueRequest(config=config), timeout=30)


def test_queues_spread_over_groups_and_any_node_serves_any_queue(cluster: LocalCluster) -> None:
    a1, a2, a3 = cluster.node_addresses
    metadata(cluster, "put_setting", "auto_provision_groups", "true")
    ch1, s1 = stub(a1)
    ch2, s2 = stub(a2)
    ch3, s3 = stub(a3)
    with ch1, ch2, ch3:
        home = create(s1, "everywhere", factor=3)
        assert home.config.replication.group == "g1"  # the nodes' own 3-replica group
        solo = create(s1, "solo", factor=1)  # no 1-replica group yet: one is provisioned
        gid = solo.config.replication.group
        assert gid not in ("", "g1")
        group = metadata(cluster, "get_shard", gid)
        assert isinstance(group.value, ShardRecord) and len(group.value.members) == 1  # type: ignore[attr-defined]
        host = group.value.members[0]  # type: ignore[attr-defined]
        host_addr = cluster.node_addresses[int(host.removeprefix("node")) - 1]
        wait_for("the group's shard to start", lambda: gid in shards_of(host_addr))
        outsiders = [a for a in cluster.node_addresses if a != host_addr]
        assert all(gid not in shards_of(a) for a in outsiders)

        # Publish through a node outside the group, read through the other outsider.
        ch_o1, o1 = stub(outsiders[0])
        ch_o2, o2 = stub(outsiders[1])
        with ch_o1, ch_o2:
            _, call = o1.Publish.with_call(
                pb.PublishRequest(
                    queue="solo", messages=[pb.PublishMessage(value=b"%d" % i) for i in range(20)]
                ),
                timeout=30,
            )
            # The answer names the group's leader, so a smart client can go there next time.
            assert dict(call.trailing_metadata())["x-fluxmq-leader"] == host_addr
            # The host's metrics cover the group it was given, not only its own.
            spec = cluster.specs()[int(host.removeprefix("node")) - 1]
            with urllib.request.urlopen(f"http://{spec.metrics_address}/metrics", timeout=10) as r:
                scraped = r.read().decode()
            assert 'fluxmq_partition_high_watermark{partition="0",queue="solo"} 20.0' in scraped
            r = o2.Fetch(pb.FetchRequest(queue="solo", partition=0, max_messages=100), timeout=30)
            assert [x.value for x in r.records] == [b"%d" % i for i in range(20)]
            o2.CreateGroup(pb.CreateGroupRequest(queue="solo", group="g"))
            got = o1.Lease(
                pb.LeaseRequest(queue="solo", group="g", consumer_id="c", max_messages=5)
            )
            assert len(got.messages) == 5
            acked = o2.Ack(
                pb.AckRequest(queue="solo", group="g", receipts=[m.receipt for m in got.messages])
            )
            assert list(acked.statuses) == [pb.RECEIPT_STATUS_ACKED] * 5
            tail = o1.Tail(pb.TailRequest(queue="solo", partitions=[0]), timeout=30)
            first = next(iter(tail))
            assert first.records[0].value == b"0"
            tail.cancel()

        # The least loaded group of the right size takes the next queue.
        other = next(n for n in ("node1", "node2", "node3") if n != host)
        port = cluster.specs()[int(other.removeprefix("node")) - 1].ports[2] + 5
        metadata(
            cluster,
            "create_shard",
            ShardRecord("gx", (other,), {other: port}, 1, 0),
        )
        wait_for("node2 to see the new group", lambda: "gx" in groups_seen_by(a2))
        assert create(s2, "solo2", factor=1).config.replication.group == "gx"
        assert create(s3, "pinned", group=gid).config.replication.group == gid

        # Listing spans every group, through any node.
        for s in (s1, s2, s3):
            names = [q.config.name for q in s.ListQueues(pb.ListQueuesRequest(limit=100)).queues]
            assert names == ["everywhere", "pinned", "solo", "solo2"]
            page = s.ListQueues(pb.ListQueuesRequest(limit=2))
            assert [q.config.name for q in page.queues] == ["everywhere", "pinned"]
            rest = s.ListQueues(pb.ListQueuesRequest(limit=2, page_token=page.next_page_token))
            assert [q.config.name for q in rest.queues] == ["solo", "solo2"]

        with pytest.raises(grpc.RpcError) as exc:
            create(s1, "nowhere", group="no-such-group")
        err = rich_error(exc.value)
        assert err.reason == "REPLICATION_GROUP_NOT_FOUND"
        assert err.fields == ["config.replication.group"]

        s1.CreateGroup(pb.CreateGroupRequest(queue="everywhere", group="g"))
        with pytest.raises(grpc.RpcError) as exc:
            s1.Transact(
                pb.TransactRequest(
                    publishes=[
                        pb.PublishRequest(queue="everywhere", messages=[pb.PublishMessage()]),
                        pb.PublishRequest(queue="solo", messages=[pb.PublishMessage()]),
                    ]
                )
            )
        assert rich_error(exc.value).reason == "TRANSACTION_SPANS_GROUPS"


def test_without_auto_provisioning_a_factor_no_group_has_is_refused(cluster: LocalCluster) -> None:
    ch, s = stub(cluster.node_addresses[0])
    with ch:
        with pytest.raises(grpc.RpcError) as exc:
            create(s, "lonely", factor=1)
        err = rich_error(exc.value)
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION
        assert err.reason == "REPLICATION_UNSATISFIABLE"
        assert "auto_provision_groups" in err.message


def test_a_group_on_a_killed_node_comes_back_with_its_data(cluster: LocalCluster) -> None:
    metadata(cluster, "put_setting", "auto_provision_groups", "true")
    ch, s = stub(cluster.node_addresses[0])
    with ch:
        gid = create(s, "single", factor=1).config.replication.group
        group = metadata(cluster, "get_shard", gid)
        host = group.value.members[0]  # type: ignore[attr-defined]
        index = int(host.removeprefix("node"))
        other = cluster.node_addresses[index % 3]  # a node outside the group
        ch2, s2 = stub(other)
        with ch2:
            s2.Publish(
                pb.PublishRequest(queue="single", messages=[pb.PublishMessage(value=b"kept")]),
                timeout=30,
            )
            cluster.kill9(index)
            with pytest.raises(grpc.RpcError) as exc:
                s2.Fetch(pb.FetchRequest(queue="single", partition=0), timeout=30)
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE  # retriable, nothing lost
            cluster.restart(index)

            def fetched() -> bool:
                try:
                    r = s2.Fetch(pb.FetchRequest(queue="single", partition=0), timeout=10)
                except grpc.RpcError:
                    return False
                return [x.value for x in r.records] == [b"kept"]

            wait_for("the group to serve again", fetched, timeout_s=30, every_s=0.2)
