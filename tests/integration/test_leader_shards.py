"""Every hosted shard answers and publishes its own leader (issue 19, item 3): on 4 nodes with
etcd, two 3-replica groups whose leaders sit on different nodes (neither on the home group's
leader), the ``x-fluxmq-leader`` trailer names each queue's own group leader through every
node, heartbeats sent to a node outside a group are forwarded to that group's leader, and both
stay right after one group's leadership moves. One cluster for the module."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
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
KEY = new_key("production")
NODES = 4
# group -> (members, the node that must lead it); the home group g1 is led by node2.
GROUPS = {
    "ga": (("node1", "node2", "node3"), "node3"),
    "gb": (("node2", "node3", "node4"), "node4"),
}
HOME_LEADER = "node2"
MOVE_ATTEMPTS = 4  # leadership transfers asked for per move (each bounded by its own timeout)
QUEUES = {"qa": "ga", "qb": "gb"}


def index(node_id: str) -> int:
    return int(node_id.removeprefix("node")) - 1


class Shards:
    """The cluster plus the Raft port of every member of ga and gb."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        specs = cluster.specs()
        self.ports = {
            gid: {m: specs[index(m)].raft_port + 3 + n for m in members}
            for n, (gid, (members, _)) in enumerate(sorted(GROUPS.items()))
        }
        self.ports["g1"] = {s.node_id: s.raft_port for s in specs}

    def address(self, node_id: str) -> str:
        return self.cluster.node_addresses[index(node_id)]

    def raft(self, group: str, node_id: str) -> str:
        return f"127.0.0.1:{self.ports[group][node_id]}"

    def node_of_raft(self, group: str, raft: str) -> str | None:
        return next((n for n in self.ports[group] if self.raft(group, n) == raft), None)

    def shard(self, node_id: str, group: str) -> admin_pb2.ShardInfo | None:
        try:
            with authorized_channel(self.address(node_id), KEY) as ch:
                st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                    admin_pb2.GetClusterStatusRequest(skip_digest=True), timeout=10
                )
        except grpc.RpcError:
            return None
        return next((s for s in st.shards if s.shard_id == group), None)

    def leader(self, group: str) -> str | None:
        """The node every member of ``group`` agrees leads it (None: no agreement yet)."""
        seen = set()
        for member in self.ports[group]:
            info = self.shard(member, group)
            seen.add(self.node_of_raft(group, info.leader) if info is not None else None)
        return seen.pop() if len(seen) == 1 else None

    def move_leader(self, group: str, target: str) -> None:
        """Bounded retries: on a loaded machine a transfer may time out (UNAVAILABLE, outcome
        unknown) while the target is still catching up; asking again is safe."""
        for attempt in range(MOVE_ATTEMPTS):
            current = None

            def agreed() -> bool:
                nonlocal current
                current = self.leader(group)
                return current is not None

            wait_for(f"{group} to elect a leader", agreed)
            assert current is not None
            if current == target:
                return
            try:
                with authorized_channel(self.address(current), KEY) as ch:
                    admin_pb2_grpc.AdminServiceStub(ch).TransferLeadership(
                        admin_pb2.TransferLeadershipRequest(
                            shard_id=group, target=self.raft(group, target)
                        ),
                        timeout=30,
                    )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or attempt == MOVE_ATTEMPTS - 1:
                    raise
                continue
            wait_for(f"{target} to lead {group}", lambda: self.leader(group) == target)
            return


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shards]:
    root: Path = tmp_path_factory.mktemp("shards") / "c"
    root.mkdir()
    (root / ADMIN_KEY_FILE).write_text(KEY + "\n")
    cluster = LocalCluster(root, nodes=NODES, base_port=free_port_range(40), etcd_port=0)
    cluster.up()
    try:
        s = Shards(cluster)

        async def create_groups() -> None:
            store = cluster.metadata_store()
            try:
                for gid, (members, _) in GROUPS.items():
                    await store.create_shard(ShardRecord(gid, members, s.ports[gid], 3, 0))
            finally:
                await store.close()

        asyncio.run(create_groups())
        for gid, (members, leader) in GROUPS.items():
            for m in members:
                wait_for(f"{m} to host {gid}", lambda m=m, gid=gid: s.shard(m, gid) is not None)
            s.move_leader(gid, leader)
        s.move_leader("g1", HOME_LEADER)
        with authorized_channel(s.address("node1"), KEY) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for queue, gid in QUEUES.items():
                config = pb.QueueConfig(
                    name=queue, partitions=2, replication=pb.Replication(group=gid)
                )
                stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=30)
                stub.CreateGroup(
                    pb.CreateGroupRequest(queue=queue, group="g", mode=pb.DELIVERY_MODE_ORDERED),
                    timeout=30,
                )
        yield s
    finally:
        cluster.down(purge=False)


def trailer(s: Shards, via: str, queue: str) -> str | None:
    try:
        with authorized_channel(s.address(via), KEY) as ch:
            _, call = queue_pb2_grpc.QueueServiceStub(ch).GetQueue.with_call(
                pb.GetQueueRequest(name=queue), timeout=10
            )
    except grpc.RpcError:
        return None
    return dict(call.trailing_metadata() or ()).get("x-fluxmq-leader")


def trailers(s: Shards) -> dict[tuple[str, str], str | None]:
    return {
        (queue, f"node{i + 1}"): trailer(s, f"node{i + 1}", queue)
        for queue in QUEUES
        for i in range(NODES)
    }


def expect_trailers(s: Shards, leaders: dict[str, str]) -> None:
    """Through every node, each queue's answers name its own group's leader."""
    want = {(q, f"node{i + 1}"): s.address(leaders[q]) for q in QUEUES for i in range(NODES)}
    wait_for(
        "every node to name each queue's leader",
        lambda: trailers(s) == want,
        show=lambda: trailers(s),
    )


def heartbeat_via(s: Shards, via: str, queue: str) -> str | None:
    """JoinGroup and two Heartbeats through ``via``; -> the leader the last answer names."""
    with authorized_channel(s.address(via), KEY) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        member = stub.JoinGroup(
            pb.JoinGroupRequest(queue=queue, group="g", consumer_id=f"c-{via}"), timeout=30
        )
        for _ in range(2):
            beat, call = stub.Heartbeat.with_call(
                pb.HeartbeatRequest(
                    queue=queue,
                    group="g",
                    member_id=member.member_id,
                    generation_id=member.generation_id,
                ),
                timeout=30,
            )
            assert not beat.should_rejoin, beat.reason
            assert beat.member_id == member.member_id
    return dict(call.trailing_metadata() or ()).get("x-fluxmq-leader")


def test_each_queue_answers_name_its_own_group_leader(shards: Shards) -> None:
    expect_trailers(shards, {"qa": "node3", "qb": "node4"})


def test_heartbeats_from_outside_a_group_reach_its_leader(shards: Shards) -> None:
    # node4 is no member of ga, node1 none of gb: both forward to the group's leader.
    assert heartbeat_via(shards, "node4", "qa") == shards.address("node3")
    assert heartbeat_via(shards, "node1", "qb") == shards.address("node4")
    # Through a member that follows, too (it knows its own group's leader).
    assert heartbeat_via(shards, "node2", "qa") == shards.address("node3")
    assert heartbeat_via(shards, "node3", "qb") == shards.address("node4")


def test_leaders_stay_right_after_one_group_transfers(shards: Shards) -> None:
    shards.move_leader("gb", "node3")
    expect_trailers(shards, {"qa": "node3", "qb": "node3"})
    shards.move_leader("gb", "node2")  # the home group's leader now leads gb too
    expect_trailers(shards, {"qa": "node3", "qb": "node2"})
    assert heartbeat_via(shards, "node1", "qb") == shards.address("node2")
    assert heartbeat_via(shards, "node4", "qa") == shards.address("node3")


# -- relayed waiting calls on SIGTERM (issue 19, item 2): node4 is no member of ga, so it only
# relays qa's calls. These two run last and stop nodes (node3, then node4): no restarts needed.

RELAYED_POLL_MS = 30_000
RELAYED_ENDED_WITHIN_S = 5.0  # the grace period is 20 s; generous on this noisy machine


def sigterm(s: Shards, node_id: str) -> float:
    state = s.cluster.load_state()
    assert state is not None
    os.kill(int(state["nodes"][index(node_id)]["pid"]), signal.SIGTERM)
    return time.monotonic()


LATEST = pb.StartPosition(latest=True)


def shared_group(s: Shards, group: str) -> None:
    """A shared group of qa that starts after what qa holds now."""
    with authorized_channel(s.address("node1"), KEY) as ch:
        queue_pb2_grpc.QueueServiceStub(ch).CreateGroup(
            pb.CreateGroupRequest(queue="qa", group=group, start=LATEST), timeout=30
        )


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Runs ``call``; the list gets (result or grpc.RpcError, monotonic end time)."""
    out: list[object] = []

    def run() -> None:
        try:
            result: object = call()
        except grpc.RpcError as err:
            result = err
        out.extend([result, time.monotonic()])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def ga_leader_among(s: Shards, members: tuple[str, ...]) -> str | None:
    seen = {
        s.node_of_raft("ga", info.leader) if info else None
        for info in (s.shard(m, "ga") for m in members)
    }
    return seen.pop() if len(seen) == 1 else None


def test_relayed_long_poll_moves_to_another_replica_when_its_node_shuts_down(
    shards: Shards,
) -> None:
    shards.move_leader("ga", "node3")  # node4 relays qa's calls to node3
    shared_group(shards, "relay-moves")
    lease = pb.LeaseRequest(
        queue="qa", group="relay-moves", consumer_id="c", wait_ms=RELAYED_POLL_MS
    )
    with authorized_channel(shards.address("node4"), KEY) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        thread, out = in_thread(lambda: stub.Lease(lease, timeout=60))
        time.sleep(1.0)
        assert not out, out
        sigterm(shards, "node3")
        wait_for(
            "node1 and node2 to agree on a new leader of ga",
            lambda: ga_leader_among(shards, ("node1", "node2")) in ("node1", "node2"),
        )
        with authorized_channel(shards.address("node1"), KEY) as ch1:
            publish = pb.PublishRequest(queue="qa", messages=[pb.PublishMessage(value=b"m")])
            queue_pb2_grpc.QueueServiceStub(ch1).Publish(publish, timeout=30)
        thread.join(40)
    # The relay did not pass node3's NODE_SHUTTING_DOWN on (the client would then avoid the
    # healthy relay): the long poll went on at another replica and got the message.
    result = out[0]
    if isinstance(result, grpc.RpcError):
        raise AssertionError(f"the relayed long poll failed: {rich_error(result)}")
    assert isinstance(result, pb.LeaseResponse)
    assert [m.record.value for m in result.messages] == [b"m"]


def test_relayed_waiting_calls_end_at_once_when_the_relay_gets_sigterm(shards: Shards) -> None:
    shared_group(shards, "relay-drain")
    with authorized_channel(shards.address("node4"), KEY) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        end = stub.Fetch(pb.FetchRequest(queue="qa", partition=0), timeout=30).high_watermark
        calls: dict[str, Callable[[], object]] = {
            "Lease": lambda: stub.Lease(
                pb.LeaseRequest(
                    queue="qa", group="relay-drain", consumer_id="poll", wait_ms=RELAYED_POLL_MS
                ),
                timeout=60,
            ),
            "Fetch": lambda: stub.Fetch(
                pb.FetchRequest(queue="qa", partition=0, offset=end, wait_ms=RELAYED_POLL_MS),
                timeout=60,
            ),
            "Consume": lambda: list(
                stub.Consume(
                    pb.ConsumeRequest(queue="qa", group="relay-drain", consumer_id="stream"),
                    timeout=60,
                )
            ),
            "Tail": lambda: list(stub.Tail(pb.TailRequest(queue="qa", start=LATEST), timeout=60)),
        }
        running = {name: in_thread(call) for name, call in calls.items()}
        time.sleep(1.5)  # every call is relayed and waiting (nothing to deliver)
        assert not any(out for _, out in running.values()), running
        sigterm_at = sigterm(shards, "node4")
        for thread, _ in running.values():
            thread.join(30)
    for name, (_, out) in running.items():
        result, ended_at = out
        assert isinstance(result, grpc.RpcError), f"{name} ended OK: {result}"
        err = rich_error(result)
        after_s = ended_at - sigterm_at  # type: ignore[operator]
        print(f"relayed {name} ended {after_s:.2f} s after the relay's SIGTERM")
        assert after_s < RELAYED_ENDED_WITHIN_S, f"{name} ended {after_s:.1f} s after SIGTERM"
        assert err.code == grpc.StatusCode.UNAVAILABLE, (name, err)
        assert err.reason == "NODE_SHUTTING_DOWN", (name, err)
