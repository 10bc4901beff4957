"""``fluxmqctl cluster status`` against a single node and a 3-replica cluster (static peers)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.cli.cluster import NodeView, _shards
from fluxmq.launcher import LocalCluster, port_free
from tests.integration.cluster import Cluster

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

    out = ctl.ok("cluster", "status", "--server", addresses)
    sections = out.split("\n\n")
    assert [r["STATUS"] for r in table(sections[0])] == ["ok", "ok", "ok"]
    assert sorted(r["ROLE"] for r in table(sections[1])) == ["follower", "follower", "leader"]
    (summary,) = table(sections[2])
    assert (summary["REPLICAS"], summary["DIGESTS"], summary["QUEUES"]) == (
        "3/3",
        "AGREE",
        "replicated",
    )
    assert sections[3].strip() == "healthy"

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
        ctl = Ctl(f"127.0.0.1:{base + 10}", tmp_path)
        ctl.ok("queue", "create", "found")
        doc = ctl.json("cluster", "status")
        assert doc["healthy"] is True, doc["problems"]
        assert sorted(n["address"] for n in doc["nodes"]) == [
            f"127.0.0.1:{base + 10 * i}" for i in range(3)
        ]
        (shard,) = doc["shards"]
        assert shard["digests"] == "AGREE" and shard["replicas_reached"] == 3
        assert shard["queues"] == ["found"]
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
