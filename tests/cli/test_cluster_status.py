"""``fluxmqctl cluster status`` against a single node and a 3-replica cluster (static peers)."""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.cluster import NodeView, Sample, _node_names, _queue_views, _shards
from fluxmq.devcluster.launcher import LocalCluster, port_free
from fluxmq.server import node_stats
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node

from .conftest import Ctl
from .test_queues import table


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", 3)
    c.start()
    yield c
    c.stop()


def test_single_node_status(ctl: Ctl) -> None:
    doc = ctl.json("cluster", "status")
    assert doc["healthy"] is True and doc["problems"] == []
    (shard,) = doc["shards"]
    assert shard["shard_id"] == "local" and shard["digests"] == "-"
    assert shard["replicas"][0]["role"] == "leader" and len(shard["replicas"][0]["digest"]) == 64
    out = ctl.ok("cluster", "status")
    assert out.rstrip().endswith("healthy")


def test_three_replicas_agree(cluster: Cluster, tmp_path: Path) -> None:
    addresses = ",".join(n.address for n in cluster.nodes)
    ctl = Ctl(cluster.nodes[1].address, tmp_path)  # writes through a follower or the leader
    ctl.ok("queue", "create", "replicated", "--partitions", "2")
    ctl.ok("publish", "replicated", "a", "b", "c")
    cluster.wait_converged()

    doc = ctl.json("cluster", "status", "--server", addresses)
    assert doc["healthy"] is True, doc["problems"]
    assert [n["reachable"] for n in doc["nodes"]] == [True, True, True]
    (shard,) = doc["shards"]
    assert shard["digests"] == "AGREE"
    assert shard["replicas_reached"] == 3 and len(shard["members"]) == 3
    assert shard["queues"] == ["replicated"]
    roles = sorted(r["role"] for r in shard["replicas"])
    assert roles == ["follower", "follower", "leader"]
    assert len({r["digest"] for r in shard["replicas"]}) == 1
    assert {r["leader"] for r in shard["replicas"]} == {shard["leader"]}
    assert all(r["lag"] == 0 for r in shard["replicas"])

    # the queue is reported once, by the shard's leader; each node has its own RPC rows
    (queue,) = doc["queues"]
    assert queue["name"] == "replicated" and queue["state"]["published_messages"] == "3"
    leader_id = next(r["node_id"] for r in shard["replicas"] if r["role"] == "leader")
    assert queue["reported_by"] == leader_id
    assert queue["counters"]["published_messages"] == 3  # summed over the nodes' counters
    reporters = []
    for n in cluster.nodes:
        with n.channel() as ch:
            stub = admin_pb2_grpc.AdminServiceStub(ch)  # type: ignore[no-untyped-call]
            st = stub.GetClusterStatus(apb.GetClusterStatusRequest(skip_digest=True), timeout=10)
        assert all(s.digest == "" for s in st.shards)
        reporters += [st.node_id for _ in st.queues]
    assert reporters == [leader_id]
    assert all(n["readiness"] == "ready" and n["etcd_session"] == "" for n in doc["nodes"])
    assert all(any(r["method"] == "GetClusterStatus" for r in n["rpcs"]) for n in doc["nodes"])

    out = ctl.ok("cluster", "status", "--server", addresses)
    sections = out.split("\n\n")
    assert [(r["STATUS"], r["READY"], r["ETCD"]) for r in table(sections[0])] == [
        ("ok", "yes", "-")
    ] * 3
    assert sorted(r["ROLE"] for r in table(sections[1])) == ["follower", "follower", "leader"]
    # Leaders are named by node id, not by Raft address.
    assert {r["LEADER"] for r in table(sections[1])} == {leader_id}
    assert shard["leader_node"] == leader_id
    (summary,) = table(sections[2])
    assert summary["LEADER"] == leader_id
    assert (summary["REPLICAS"], summary["DIGESTS"], summary["QUEUES"]) == (
        "3/3",
        "AGREE",
        "replicated",
    )
    (qrow,) = table(sections[3])
    assert (qrow["QUEUE"], qrow["PUBLISHED"], qrow["PUB/S"]) == ("replicated", "3", "0.0")
    assert sections[4].strip() == "consumer groups: none"
    assert {r["NODE"] for r in table(sections[5])} == {n["node_id"] for n in doc["nodes"]}
    assert sections[6].strip() == "healthy"

    # one seed of a static cluster: the others are not listed, so not reached -> unhealthy
    proc = ctl.run("cluster", "status", "--server", cluster.nodes[0].address)
    assert proc.returncode == 1
    assert "1 of 3 replicas reached" in proc.stdout

    # a replica down: reported, exit 1; the other two still agree
    cluster.nodes[2].stop()
    proc = ctl.run("-o", "json", "cluster", "status", "--server", addresses)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["healthy"] is False
    assert [n["reachable"] for n in doc["nodes"]] == [True, True, False]
    assert any("UNAVAILABLE" in p for p in doc["problems"])
    assert any("2 of 3 replicas reached" in p for p in doc["problems"])
    assert doc["shards"][0]["digests"] in ("AGREE", "UNCHECKED")


def _free_port_range(span: int = 30) -> int:
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000 - span)
        if all(port_free(p) for p in range(base, base + span)):
            return base
    raise AssertionError("no free port range")


def test_etcd_cluster_is_found_from_one_node(tmp_path: Path) -> None:
    """With etcd every node lists the others: one address is enough."""
    base = _free_port_range()
    lc = LocalCluster(tmp_path / "lc", nodes=3, base_port=base, etcd_port=0, quiet=True)
    lc.up(timeout_s=60)
    try:
        ctl = Ctl(f"127.0.0.1:{base + 10}", tmp_path, api_key=lc.api_key())
        ctl.ok("queue", "create", "found")
        doc = ctl.json("cluster", "status")
        assert doc["healthy"] is True, doc["problems"]
        assert sorted(n["address"] for n in doc["nodes"]) == [
            f"127.0.0.1:{base + 10 * i}" for i in range(3)
        ]
        (shard,) = doc["shards"]
        assert shard["digests"] == "AGREE" and shard["replicas_reached"] == 3
        assert shard["queues"] == ["found"]
        assert [n["etcd_session"] for n in doc["nodes"]] == ["up", "up", "up"]
        out = ctl.ok("cluster", "status", "--window", "0")
        assert [r["ETCD"] for r in table(out.split("\n\n")[0])] == ["up", "up", "up"]
        # node list: every node with its lag (entries behind its groups' leaders), 0 here
        deadline = time.monotonic() + 30
        while True:
            listed = ctl.json("node", "list")["nodes"]
            if [n["lag"] for n in listed] == [0, 0, 0]:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.2)
        assert [n["node_id"] for n in listed] == ["node1", "node2", "node3"]
        assert table(ctl.ok("node", "list"))[0]["LAG"] == "0"
        # A node that does not answer is named from the directory (its registration lasts
        # until its lease lapses), not shown as "?".
        lc.kill9(3)
        proc = ctl.run("cluster", "status", "--window", "0")
        assert proc.returncode == 1
        rows = {r["NODE"]: r["STATUS"] for r in table(proc.stdout.split("\n\n")[0])}
        assert rows["node3"] == "unreachable" and "?" not in rows, rows
        assert "node node3 (127.0.0.1:" in proc.stdout
        by_id = {n["node_id"]: n for n in ctl.json("node", "list")["nodes"]}
        assert by_id["node3"]["lag"] is None and by_id["node1"]["lag"] == 0
    finally:
        lc.down(purge=True)


def _view(node_id: str, applied: int, digest: str, leader: str = "r1") -> NodeView:
    info = apb.ShardInfo(
        shard_id="g1",
        role="leader" if node_id == "n1" else "follower",
        leader=leader,
        applied_index=applied,
        commit_index=7,
        digest=digest,
        members=["r1", "r2", "r3"],
    )
    return NodeView(f"{node_id}:1", apb.ClusterStatus(node_id=node_id, shards=[info]))


@pytest.mark.parametrize(
    ("replicas", "verdict", "problems"),
    [
        ([(7, "d"), (7, "d"), (7, "d")], "AGREE", 0),
        ([(7, "d"), (7, "d"), (6, "c")], "AGREE", 0),
        ([(7, "d"), (7, "x"), (7, "d")], "DIFFER", 1),
        ([(7, "d"), (6, "c"), (5, "b")], "UNCHECKED", 0),
        ([(7, "d"), (7, "d")], "AGREE", 1),  # a replica not reached
    ],
)
def test_digest_verdicts(replicas: list[tuple[int, str]], verdict: str, problems: int) -> None:
    views = [_view(f"n{i + 1}", applied, digest) for i, (applied, digest) in enumerate(replicas)]
    (shard,) = _shards(views)
    assert shard.verdict == verdict
    assert len(shard.problems) == problems, shard.problems
    assert shard.lag(shard.replicas[-1][1]) == 7 - replicas[-1][0]


def test_leaderless_or_split_views_are_problems() -> None:
    (shard,) = _shards([_view("n1", 7, "d", ""), _view("n2", 7, "d"), _view("n3", 7, "d")])
    assert shard.problems == ["shard g1: a replica knows no leader"]
    (shard,) = _shards([_view("n1", 7, "d", "r2"), _view("n2", 7, "d"), _view("n3", 7, "d")])
    assert shard.problems == ["shard g1: replicas name different leaders: r1, r2"]


# -- what the dashboard shows, in text ------------------------------------------------------------


def _section(out: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the table of ``cluster status`` whose headers start with ``first_header``
    (space-separated; tables are told apart by their headers)."""
    for section in out.split("\n\n"):
        lines = section.strip().splitlines()
        if lines and lines[0].split()[:2] == first_header.split():
            return table(section)
    raise AssertionError(f"no table {first_header!r} in:\n{out}")


def _queue_row(out: str, queue: str) -> dict[str, str]:
    (row,) = [r for r in _section(out, "QUEUE SHARD") if r["QUEUE"] == queue]
    return row


def _lease(node: Node, queue: str, group: str, n: int) -> list[pb.Receipt]:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
        resp = stub.Lease(
            pb.LeaseRequest(
                queue=queue, group=group, consumer_id="c-1", max_messages=n, lease_ms=600_000
            ),
            timeout=10,
        )
    return [m.receipt for m in resp.messages]


def _nack_dead(node: Node, queue: str, group: str, receipts: list[pb.Receipt]) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
        resp = stub.Nack(
            pb.NackRequest(queue=queue, group=group, receipts=receipts, dead=True), timeout=10
        )
    assert list(resp.statuses) == [pb.RECEIPT_STATUS_DEAD_LETTERED] * len(receipts), resp


def test_status_shows_queues_groups_dead_letters_and_rpcs(ctl: Ctl, node: Node) -> None:
    ctl.ok("queue", "create", "traffic", "--type", "work", "--max-attempts", "3")
    ctl.ok("queue", "update", "traffic", "--set", "dead_letter_alert_threshold=1")
    ctl.ok("group", "create", "traffic", "workers")
    ctl.ok("publish", "traffic", *[f"m{i}" for i in range(7)])  # offsets 0..6

    out = ctl.ok("cluster", "status", "--window", "0")
    row = _queue_row(out, "traffic")
    assert (row["SHARD"], row["PUBLISHED"], row["DELIVERED"]) == ("local", "7", "0")
    assert (row["PUB/S"], row["DEL/S"], row["DLQ"], row["ALERT"]) == ("-", "-", "0", "ok")
    (group,) = [r for r in _section(out, "QUEUE GROUP") if r["QUEUE"] == "traffic"]
    assert group == {
        "QUEUE": "traffic",
        "GROUP": "workers",
        "LAG": "7",
        "IN_FLIGHT": "0",
        "SCHEDULED": "0",
        "DEAD": "0",
    }

    # 2 consumed and acked (offsets 0, 1), then 3 leased and kept (2, 3, 4): lag 5, 3 in flight
    ctl.ok("consume", "traffic", "-g", "workers", "-n", "2")
    receipts = _lease(node, "traffic", "workers", 3)
    assert [r.offset for r in receipts] == [2, 3, 4]
    out = ctl.ok("cluster", "status", "--window", "0")
    assert _queue_row(out, "traffic")["DELIVERED"] == "5"
    (group,) = [r for r in _section(out, "QUEUE GROUP") if r["QUEUE"] == "traffic"]
    assert (group["LAG"], group["IN_FLIGHT"], group["DEAD"]) == ("5", "3", "0")

    # two of them dead-lettered: done for the group (lag 3: offsets 4..6), 2 in the DLQ, which
    # is past the alert threshold of 1 (the alert is raised within a second)
    _nack_dead(node, "traffic", "workers", receipts[:2])
    deadline = time.monotonic() + 10
    while True:
        out = ctl.ok("cluster", "status", "--window", "0")
        row = _queue_row(out, "traffic")
        if row["ALERT"] == "RAISED" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (row["PUBLISHED"], row["DLQ"], row["ALERT"]) == ("7", "2", "RAISED")
    (group,) = [r for r in _section(out, "QUEUE GROUP") if r["QUEUE"] == "traffic"]
    assert (group["LAG"], group["IN_FLIGHT"], group["DEAD"]) == ("3", "1", "2")
    dlq = _queue_row(out, "traffic.dlq")  # the DLQ is a queue of its own
    assert (dlq["PUBLISHED"], dlq["DLQ"], dlq["ALERT"]) == ("2", "-", "-")

    # one row per method of this node: Publish counted once per call, Nack with no error
    rpcs = {r["METHOD"]: r for r in _section(out, "NODE METHOD")}
    assert rpcs["Publish"]["NODE"] == "local" and int(rpcs["Publish"]["CALLS"]) >= 1
    assert (rpcs["Nack"]["CALLS"], rpcs["Nack"]["ERRORS"], rpcs["Nack"]["CODES"]) == ("1", "0", "-")
    assert 0 < float(rpcs["Publish"]["P50_MS"]) <= float(rpcs["Publish"]["P99_MS"])

    # an error is counted by its code
    ctl.fails(1, "queue", "describe", "no-such-queue")
    rpcs = {
        r["METHOD"]: r
        for r in _section(ctl.ok("cluster", "status", "--window", "0"), "NODE METHOD")
    }
    assert rpcs["GetQueue"]["ERRORS"] == "1" and rpcs["GetQueue"]["CODES"] == "NOT_FOUND=1"

    # -o json carries the same
    doc = ctl.json("cluster", "status", "--window", "0")
    (q,) = [q for q in doc["queues"] if q["name"] == "traffic"]
    assert q["reported_by"] == "local" and q["published_per_s"] is None
    state = q["state"]
    assert (state["published_messages"], state["dead_letters"], state["dead_letter_alert"]) == (
        "7",
        "2",
        True,
    )
    assert state["dead_letter_queue"] == "traffic.dlq"
    (g,) = state["groups"]
    assert (g["name"], g["lag"], g["in_flight"], g["dead_lettered"]) == ("workers", "3", "1", "2")
    assert q["counters"]["published_messages"] == 7 and q["counters"]["delivered_messages"] == 5
    assert q["counters_per_s"]["published_messages"] is None
    (n,) = doc["nodes"]
    assert n["readiness"] == "ready"
    methods = {r["method"]: r for r in n["rpcs"]}
    assert int(methods["Publish"]["calls"]) >= 1
    assert methods["GetQueue"]["errors_by_code"] == {"NOT_FOUND": "1"}


def test_status_rates(ctl: Ctl, node: Node) -> None:
    ctl.ok("queue", "create", "rated")
    ctl.ok("publish", "rated", "first")

    # nothing published during the window: rate 0, not unknown
    row = _queue_row(ctl.ok("cluster", "status", "--window", "1"), "rated")
    assert (row["PUBLISHED"], row["PUB/S"], row["PUB_B/S"], row["DEL/S"]) == (
        "1",
        "0.0",
        "0",
        "0.0",
    )

    # publishing while the command samples: rate > 0
    stop = threading.Event()
    published = [0]

    def publish() -> None:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
            while not stop.is_set():
                stub.Publish(
                    pb.PublishRequest(
                        queue="rated", messages=[pb.PublishMessage(value=b"x" * 100)]
                    ),
                    timeout=10,
                )
                published[0] += 1
                time.sleep(0.02)

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    try:
        out = ctl.ok("cluster", "status", "--window", "2")
    finally:
        stop.set()
        worker.join(10)
    row = _queue_row(out, "rated")
    assert published[0] > 0
    assert float(row["PUB/S"]) > 0 and float(row["PUB_B/S"]) > 0, row
    assert 1 < int(row["PUBLISHED"]) <= 1 + published[0]
    # and a window without publishing again: 0
    row = _queue_row(ctl.ok("cluster", "status", "--window", "0.5"), "rated")
    assert row["PUB/S"] == "0.0" and row["PUBLISHED"] == str(1 + published[0])


def test_window_and_top_are_checked(ctl: Ctl) -> None:
    ctl.fails(2, "cluster", "status", "--window", "-1")
    ctl.fails(2, "cluster", "status", "--window", "soon")
    ctl.fails(2, "cluster", "status", "--top", "0")
    out = ctl.ok("cluster", "status", "--window", "0", "--top", "1")
    assert len(_section(out, "NODE METHOD")) == 1
    assert "more methods: raise --top" in out


def _sample(node_id: str, sampled_ms: int, published: int, counted: int) -> apb.ClusterStatus:
    return apb.ClusterStatus(
        node_id=node_id,
        sampled_ms=sampled_ms,
        queues=[apb.QueueStatus(name="q", published_messages=published)] if published else [],
        queue_counters=[apb.QueueCounters(queue="q", published_bytes=counted)],
    )


def test_rates_sum_over_nodes_and_survive_resets() -> None:
    first = Sample({"n1": _sample("n1", 1000, 10, 100), "n2": _sample("n2", 1000, 0, 50)})
    last = Sample({"n1": _sample("n1", 3000, 30, 300), "n2": _sample("n2", 2000, 0, 20)})
    (q,) = _queue_views(first, last, rated=True)
    assert q.reported_by == "n1" and q.published_rate == 10.0  # (30 - 10) / 2 s
    # n1: 200 B in 2 s; n2 restarted (its counter went down): 20 B counted in 1 s
    assert q.rates["published_bytes"] == 100.0 + 20.0
    assert q.counters["published_bytes"] == 320
    assert q.rates["delivered_messages"] == 0.0  # nothing delivered: 0, not unknown
    (q,) = _queue_views(first, first, rated=False)
    assert q.published_rate is None and q.rates["published_bytes"] is None


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, [(0.001, 0), (0.002, 10), (math.inf, 10)], 0.0015),
        (0.99, [(0.001, 5), (math.inf, 10)], 0.001),  # past the last bound: the last bound
        (0.5, [(0.001, 0), (math.inf, 0)], 0.0),  # no calls
        (0.5, [(0.001, 4), (0.002, 4), (0.004, 8), (math.inf, 8)], 0.001),
    ],
)
def test_latency_quantiles(q: float, buckets: list[tuple[float, float]], expected: float) -> None:
    assert node_stats.quantile(q, buckets) == pytest.approx(expected)


def test_addresses_are_named_by_the_nodes_that_own_them() -> None:
    """Leaders of placed groups use Raft ports above the node's base: each replica's own
    address (members[0]) names it; a node that did not answer is named by the directory."""
    me = apb.ClusterStatus(
        node_id="n1",
        nodes=[
            apb.NodeEntry(node_id="n1", grpc_address="h:1", raft_address="h:7100"),
            apb.NodeEntry(node_id="n2", grpc_address="h:2", raft_address="h:7200"),
        ],
        shards=[apb.ShardInfo(shard_id="g7", members=["h:7103", "h:7204"], leader="h:7204")],
    )
    other = apb.ClusterStatus(
        node_id="n2", shards=[apb.ShardInfo(shard_id="g7", members=["h:7204", "h:7103"])]
    )
    names = _node_names([NodeView("h:1", me), NodeView("h:2", other), NodeView("h:3", None)])
    assert names["h:7204"] == "n2" and names["h:7103"] == "n1" and names["h:7100"] == "n1"
    assert names["h:2"] == "n2" and "h:3" not in names
