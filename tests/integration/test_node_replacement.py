"""Nodes come and go (issue 37). A node lost for good is replaced by the placement
controller: 4 nodes with etcd, queues on two 3-replica groups, a publisher running; node4 (a
member of gb) is killed with kill -9 and never comes back. After ``node_dead_after_ms`` the
controller writes gb's record with node1 in node4's place (on a Raft port claimed in the same
write); gb's leader removes node4 from the Raft membership and adds node1, which starts on
probation and is refilled. Then gb has 3 in-sync replicas again, every acknowledged message is
on each of them exactly once, and their digests agree. When node4 comes back its old replica of
gb is no member any more: it stops it and sets its data aside.

And a live node drained under load (after one replica moved by hand with ``fluxmqctl shard
move``), then decommissioned and stopped: nothing lost or duplicated, no call failed beyond the
retriable errors a client retries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import new_key
from fluxmq.devcluster.launcher import ADMIN_KEY_FILE, LocalCluster
from fluxmq.metadata import ShardRecord
from tests.cli.conftest import fluxmqctl_path
from tests.integration.conftest import authorized_channel
from tests.integration.group_helpers import wait_for
from tests.integration.rpc_helpers import rich_error
from tests.integration.test_cluster_cli import free_port_range

pytestmark = pytest.mark.slow
KEY = new_key("production")
DEAD_AFTER_MS = 10_000
GROUPS = {"ga": ("node1", "node2", "node3"), "gb": ("node2", "node3", "node4")}
QUEUES = {"qa": "ga", "qb": "gb"}
PUBLISH_MAX = 400  # per queue, over the whole test
PARTITIONS = 2


def index(node_id: str) -> int:
    return int(node_id.removeprefix("node")) - 1


class Replacement:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.acked: dict[str, list[bytes]] = {q: [] for q in QUEUES}
        self.failures: list[str] = []
        self._stop = threading.Event()

    def address(self, node_id: str) -> str:
        return self.cluster.node_addresses[index(node_id)]

    def cluster_nodes(self) -> list[str]:
        return [f"node{i + 1}" for i in range(len(self.cluster.node_addresses))]

    def status(self, node_id: str, digest: bool = False) -> admin_pb2.ClusterStatus | None:
        try:
            with authorized_channel(self.address(node_id), KEY) as ch:
                return admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                    admin_pb2.GetClusterStatusRequest(skip_digest=not digest), timeout=20
                )
        except grpc.RpcError:
            return None

    def shard(self, node_id: str, group: str, digest: bool = False) -> admin_pb2.ShardInfo | None:
        st = self.status(node_id, digest)
        return None if st is None else next((s for s in st.shards if s.shard_id == group), None)

    def record(self, group: str) -> ShardRecord | None:
        async def read() -> ShardRecord | None:
            store = self.cluster.metadata_store()
            try:
                v = await store.get_shard(group)
                return None if v is None else v.value
            finally:
                await store.close()

        return asyncio.run(read())

    # -- the publisher ------------------------------------------------------------------------

    def publish_routine(self, via: list[str], rounds: int = PUBLISH_MAX) -> None:
        """One message per queue per round, each with its own idempotency key (a retry after
        an unknown outcome is deduplicated), bounded in count; errors the SDK would retry are
        retried, anything else is recorded as a failure."""
        for i in range(rounds):
            if self._stop.is_set():
                return
            for queue in QUEUES:
                value = f"{queue}-{i:05d}".encode()
                if self.publish_one(via, queue, value):
                    self.acked[queue].append(value)
            time.sleep(0.02)

    def publish_one(self, via: list[str], queue: str, value: bytes) -> bool:
        req = pb.PublishRequest(
            queue=queue,
            messages=[pb.PublishMessage(value=value, idempotency_key=value.decode())],
            request_timeout_ms=3000,
        )
        for attempt in range(40):
            if self._stop.is_set():
                return False
            try:
                with authorized_channel(self.address(via[attempt % len(via)]), KEY) as ch:
                    queue_pb2_grpc.QueueServiceStub(ch).Publish(req, timeout=5)
                return True
            except grpc.RpcError as err:
                if err.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ):
                    self.failures.append(f"{queue} {value!r}: {err.code()} {err.details()}")
                    return False
                time.sleep(0.1)
        self.failures.append(f"{queue} {value!r}: not acknowledged after 40 retriable errors")
        return False

    def stop(self) -> None:
        self._stop.set()

    def check_replicas(self) -> None:
        """Each queue's group: its replicas (as its record names them) agree, and each holds
        every acknowledged message of the queue exactly once."""
        for queue, gid in QUEUES.items():
            rec = self.record(gid)
            assert rec is not None

            def settled(rec: ShardRecord = rec) -> bool:
                infos = [self.shard(n, rec.group_id, digest=True) for n in rec.members]
                return all(i is not None for i in infos) and (
                    len({(i.applied_index, i.digest) for i in infos if i is not None}) == 1
                )

            wait_for(f"{gid}'s replicas to agree", settled, timeout_s=60)
            acked = self.acked[queue]
            for node_id in rec.members:
                stored = self.stored(node_id, queue)
                lost = [v for v in acked if stored[v] == 0]
                doubled = [v for v in acked if stored[v] > 1]
                assert not lost, f"{node_id} {queue}: {len(lost)} of {len(acked)} lost: {lost[:5]}"
                assert not doubled, f"{node_id} {queue}: {len(doubled)} stored twice"

    def stored(self, node_id: str, queue: str) -> Counter[bytes]:
        out: Counter[bytes] = Counter()
        with authorized_channel(self.address(node_id), KEY) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for p in range(PARTITIONS):
                offset = 0
                for _ in range(1000):
                    r = stub.Fetch(
                        pb.FetchRequest(queue=queue, partition=p, offset=offset, max_messages=1000),
                        timeout=10,
                    )
                    out.update(rec.value for rec in r.records)
                    if r.next_offset >= r.high_watermark:
                        break
                    offset = r.next_offset
        return out


@contextlib.contextmanager
def cluster_with_groups(
    root: Path, groups: dict[str, tuple[str, ...]], node4_joins: bool = False
) -> Iterator[Replacement]:
    """4 nodes with etcd (FLUXMQ_NODE_DEAD_AFTER_MS set by the caller), ``groups`` placed by
    hand, the queues of QUEUES on them. ``node4_joins``: node1-3 make up the home group and
    node4 is added after them, without one (``fluxmq cluster add-node``)."""
    root.mkdir()
    (root / ADMIN_KEY_FILE).write_text(KEY + "\n")
    first = 3 if node4_joins else 4
    cluster = LocalCluster(root, nodes=first, base_port=free_port_range(40), etcd_port=0)
    cluster.up()
    try:
        if node4_joins:
            assert cluster.add_node() == 4
        specs = cluster.specs()

        async def create_groups() -> None:
            store = cluster.metadata_store()
            try:
                for n, (gid, members) in enumerate(sorted(groups.items())):
                    ports = {m: specs[index(m)].raft_port + 3 + n for m in members}
                    await store.create_shard(ShardRecord(gid, members, ports, 3, 0))
            finally:
                await store.close()

        asyncio.run(create_groups())
        r = Replacement(cluster)
        for gid, members in groups.items():
            for m in members:
                wait_for(f"{m} to host {gid}", lambda m=m, gid=gid: r.shard(m, gid) is not None)
        with authorized_channel(r.address("node1"), KEY) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for queue, gid in QUEUES.items():
                config = pb.QueueConfig(
                    name=queue,
                    partitions=PARTITIONS,
                    dedup_window="10m",
                    replication=pb.Replication(group=gid),
                )
                stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=30)
        yield r
    finally:
        cluster.down(purge=False)


@pytest.fixture
def replacement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Replacement]:
    monkeypatch.setenv("FLUXMQ_NODE_DEAD_AFTER_MS", str(DEAD_AFTER_MS))
    with cluster_with_groups(tmp_path / "cluster", GROUPS) as r:
        yield r


def test_a_node_lost_for_good_has_its_replicas_replaced_and_nothing_is_lost(
    replacement: Replacement,
) -> None:
    r = replacement
    publisher = threading.Thread(target=r.publish_routine, args=(["node1", "node2", "node3"],))
    publisher.start()
    try:
        wait_for("some messages acknowledged", lambda: len(r.acked["qb"]) >= 20, timeout_s=60)
        before = r.record("gb")
        assert before is not None
        old_replica = f"127.0.0.1:{before.raft_ports['node4']}"
        r.cluster.kill9(4)
        killed_at = time.monotonic()

        def replaced() -> bool:
            record = r.record("gb")
            return record is not None and record.members == ("node1", "node2", "node3")

        wait_for("gb's record to name node1 in node4's place", replaced, timeout_s=60)
        assert time.monotonic() - killed_at >= DEAD_AFTER_MS / 1000 - 1  # not before its time

        def whole_again() -> bool:
            infos = [r.shard(n, "gb") for n in ("node1", "node2", "node3")]
            if any(i is None for i in infos):
                return False
            leaders = [i for i in infos if i is not None and i.role == "leader"]
            return (
                len(leaders) == 1
                and len(leaders[0].members) == 3
                and leaders[0].in_sync_replicas == 3
                and not any(i.on_probation for i in infos if i is not None)
            )

        wait_for("gb to have 3 in-sync replicas again", whole_again, timeout_s=90)
        wait_for("more messages acknowledged", lambda: len(r.acked["qb"]) >= 60, timeout_s=60)
    finally:
        r.stop()
        publisher.join(timeout=120)
    assert not publisher.is_alive()
    assert not r.failures, r.failures[:5]

    # Every acknowledged message is on each replica exactly once, and they agree.
    r.check_replicas()

    # node4 comes back: its old replica of gb is no member any more; it stops it and sets its
    # data aside (the controller may well place a new replica on it: it holds the fewest).
    data_dir = Path(r.cluster.specs()[3].data_dir)

    def old_one_served() -> bool:
        st = r.status("node4")
        return st is None or any(
            s.shard_id == "gb" and s.members[0] == old_replica for s in st.shards
        )

    r.cluster.restart(4)
    wait_for(
        "node4 to set its old replica of gb aside",
        lambda: (
            (data_dir / "groups.removed").is_dir()
            and any(p.name.startswith("gb-") for p in (data_dir / "groups.removed").iterdir())
            and not old_one_served()
        ),
        timeout_s=60,
    )
    r.cluster.restart(4)  # what was set aside is not served again
    time.sleep(2)
    assert not old_one_served()


def ctl(r: Replacement, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """``fluxmqctl`` as an operator runs it, against node1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLUXMQ", "FLUXMQCTL"))}
    env.update(FLUXMQ_ADDR=r.address("node1"), FLUXMQ_API_KEY=KEY, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [fluxmqctl_path(), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def move_refused(r: Replacement, group: str, from_node: str, to_node: str) -> str:
    with authorized_channel(r.address("node3"), KEY) as ch, pytest.raises(grpc.RpcError) as raised:
        admin_pb2_grpc.AdminServiceStub(ch).MoveReplica(
            admin_pb2.MoveReplicaRequest(shard_id=group, from_node=from_node, to_node=to_node),
            timeout=20,
        )
    err = rich_error(raised.value)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION, err
    assert err.reason == "MOVE_REFUSED", err
    return err.message


def test_a_live_node_drained_under_load_then_decommissioned_loses_nothing(
    replacement: Replacement,
) -> None:
    r = replacement
    publisher = threading.Thread(target=r.publish_routine, args=(["node1", "node3", "node4"],))
    publisher.start()
    try:
        wait_for("some messages acknowledged", lambda: len(r.acked["qb"]) >= 20, timeout_s=60)
        # One replica by hand: gb's node4 to node1 (node4 is live: added first, removed after).
        moved = ctl(r, "shard", "move", "gb", "--from", "node4", "--to", "node1")
        assert moved.returncode == 0, moved.stderr
        assert "members now node1, node2, node3" in moved.stdout
        assert r.record("gb") is not None and r.record("gb").members == ("node1", "node2", "node3")
        assert "already holds" in move_refused(r, "gb", "node2", "node1")

        def gb_moved() -> bool:
            info = r.shard("node1", "gb")
            leader = next(
                (
                    i
                    for n in ("node1", "node2", "node3")
                    if (i := r.shard(n, "gb")) and i.role == "leader"
                ),
                None,
            )
            return (
                info is not None
                and not info.on_probation
                and leader is not None
                and len(leader.members) == 3
                and leader.in_sync_replicas == 3
            )

        wait_for("gb's replica to be on node1, node4's gone", gb_moved, timeout_s=90)

        # Drain node2 (in ga and gb, maybe a leader): the CLI waits and shows progress.
        drained = ctl(r, "node", "drain", "node2", "--wait", "150", timeout_s=170)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "node2: drained; replicas left: none" in drained.stdout, drained.stdout
        for group in ("ga", "gb"):
            record = r.record(group)
            assert record is not None and "node2" not in record.members, record
        listed = ctl(r, "node", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        nodes = {n["node_id"]: n for n in json.loads(listed.stdout)["nodes"]}
        assert nodes["node2"]["state"] == "drained" and not nodes["node2"].get("groups")
        assert "ga" not in nodes["node2"].get("leading", []) and "gb" not in nodes["node2"].get(
            "leading", []
        )
        decommissioned = ctl(r, "node", "decommission", "node2", "--wait", "60")
        assert decommissioned.returncode == 0, decommissioned.stdout + decommissioned.stderr
        assert "decommissioned" in move_refused(r, "ga", "node1", "node2")
        wait_for("more messages acknowledged", lambda: len(r.acked["qa"]) >= 80, timeout_s=60)
        r.cluster.stop_node(2)
        wait_for("even more messages", lambda: len(r.acked["qa"]) >= 100, timeout_s=60)
    finally:
        r.stop()
        publisher.join(timeout=120)
    assert not publisher.is_alive()
    assert not r.failures, r.failures[:5]

    r.check_replicas()


def leads(r: Replacement) -> dict[str, int]:
    """How many groups each node leads, by the leader records."""

    async def read() -> dict[str, tuple[str, int]]:
        store = r.cluster.metadata_store()
        try:
            return await store.get_shard_leaders()
        finally:
            await store.close()

    counts = {f"node{i}": 0 for i in range(1, 5)}
    for node, _term in asyncio.run(read()).values():
        counts[node] = counts.get(node, 0) + 1
    return counts


def lead_by(r: Replacement, gid: str, target: str) -> bool:
    """Ask ``gid``'s leader to hand over to ``target`` (-> whether ``target`` leads it now)."""
    own = r.shard(target, gid)
    if own is None:
        return False
    if own.role == "leader":
        return True
    holder = next(
        (n for n in r.cluster_nodes() if (i := r.shard(n, gid)) is not None and i.role == "leader"),
        None,
    )
    if holder is not None:
        with contextlib.suppress(grpc.RpcError), authorized_channel(r.address(holder), KEY) as ch:
            admin_pb2_grpc.AdminServiceStub(ch).TransferLeadership(
                admin_pb2.TransferLeadershipRequest(shard_id=gid, target=own.members[0]),
                timeout=20,
            )
    return False


def test_a_node_that_holds_nothing_gets_replicas_and_leaders_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaling a StatefulSet out and in, and a rolling restart, as the manifests do it, under
    load: ga and gb on node1-3 (the home group g1 too), node4 added after them without a home
    group (``--join``, a pod beyond the home group): the controller moves a replica to node4 on
    its own; with every leader pushed onto one node, leadership spreads again. Then node4's
    preStop drain (``node drain --until-restart``) moves everything off it and it stops (scale
    in), node1-3 restart one at a time (rolling restart), node4 starts again and is active:
    it gets a replica back. No call fails beyond retriable errors, nothing acknowledged is lost
    or doubled, and no node leads more than ceil(groups/nodes)+1."""
    monkeypatch.setenv("FLUXMQ_NODE_DEAD_AFTER_MS", str(DEAD_AFTER_MS))
    groups = {"ga": ("node1", "node2", "node3"), "gb": ("node1", "node2", "node3")}
    with cluster_with_groups(tmp_path / "cluster", groups, node4_joins=True) as r:
        publisher = threading.Thread(
            target=r.publish_routine, args=(["node1", "node2", "node3"], 4000)
        )
        publisher.start()
        try:

            def node4_holds_one() -> bool:
                records = [r.record(g) for g in groups]
                return sum("node4" in rec.members for rec in records if rec is not None) == 1

            wait_for("a replica moved to node4", node4_holds_one, timeout_s=60)
            moved = next(g for g in groups if "node4" in (r.record(g) or groups[g]).members)

            def converged() -> bool:
                info = r.shard("node4", moved)
                return (
                    info is not None
                    and not info.on_probation
                    and len(info.members) == 3
                    and r.shard("node4", moved, digest=True) is not None
                )

            wait_for(f"node4's replica of {moved} to take part", converged, timeout_s=60)
            # The replica that made way stops (a removed member is connected to nobody and
            # never campaigns: it would otherwise serve stale reads of the group forever).
            (gone,) = set(groups[moved]) - set((r.record(moved) or groups[moved]).members)
            wait_for(
                f"{gone} to stop its replica of {moved}",
                lambda: r.shard(gone, moved) is None and r.status(gone) is not None,
                timeout_s=40,
            )
            dry = ctl(r, "shard", "rebalance", "--dry-run")
            assert dry.returncode == 0 and "nothing to move" in dry.stdout, dry.stdout + dry.stderr

            # Every leader onto one node that is in every group (3 groups, 4 nodes: the
            # ceiling is 1, the bound 2): it leads 3, and gives two away.
            records = {g: r.record(g) for g in groups}
            busy = next(
                n
                for n in ("node1", "node2", "node3")
                if all(rec is not None and n in rec.members for rec in records.values())
            )
            for gid in ("g1", *groups):
                wait_for(
                    f"{busy} to lead {gid}", lambda gid=gid: lead_by(r, gid, busy), timeout_s=60
                )
            wait_for(
                f"leadership to spread from {busy}",
                lambda: max(leads(r).values()) <= 2 and leads(r)[busy] <= 1,
                timeout_s=60,
                show=lambda: leads(r),
            )

            # Scale in: node4's preStop hook drains it until it restarts, then it stops.
            left = ctl(r, "node", "drain", "node4", "--until-restart", "--wait", "150",
                       timeout_s=170)  # fmt: skip
            assert left.returncode == 0, left.stdout + left.stderr
            assert "node4: drained; replicas left: none" in left.stdout, left.stdout
            assert not any("node4" in (r.record(g) or groups[g]).members for g in groups)
            r.cluster.stop_node(4)
            # Rolling restart of the home group's nodes, one at a time, under load.
            for i in range(1, 4):
                before = len(r.acked["qa"])
                r.cluster.restart(i)
                wait_for(f"publishing after node{i} restarted", lambda b=before: len(
                    r.acked["qa"]) > b + 10, timeout_s=60)  # fmt: skip
            # Scale out again: node4 starts, is active (no longer leaving), gets a replica.
            r.cluster.restart(4)
            wait_for("a replica back on node4", node4_holds_one, timeout_s=90)
            assert (
                "was leaving (drained by its own stop): active again"
                in Path(r.cluster.specs()[3].log).read_text()
            )
        finally:
            r.stop()
            publisher.join(timeout=120)
        assert not publisher.is_alive()
        assert not r.failures, r.failures[:5]
        wait_for(
            "leaders of all groups after the restart",
            lambda: (
                sum(leads(r).values()) == 3
                and all(
                    (r.shard(f"node{i}", "g1") or admin_pb2.ShardInfo()).leader for i in range(1, 4)
                )
            ),
            timeout_s=90,
        )
        cap = -(-3 // 4)
        wait_for(
            "no node to lead more than ceil(groups/nodes)+1",
            lambda: max(leads(r).values()) <= cap + 1,
            timeout_s=60,
        )
        r.check_replicas()
