"""Readiness policy: a node is ready only when serving, every shard it hosts has a leader and
has applied what was committed when it first saw one, and its etcd session is up."""

from __future__ import annotations

import doctest

import fluxmq.server.health as health_mod
from fluxmq.server.health import CatchUp, judge
from raft import ShardStatus


def status(shard: str = "g1", commit: int = 10, applied: int = 10, leader: str | None = "a"):
    return ShardStatus(shard, "follower", 2, commit, applied, ("a", "b", "c"), leader, 0)


def ready(shards: list[ShardStatus], cu: CatchUp, **kw: bool) -> tuple[bool, str]:
    args = {"serving": True, "stopping": False, "etcd_configured": False, "etcd_joined": False}
    args.update(kw)
    v = judge(shards=shards, catch_up=cu, **args)  # type: ignore[arg-type]
    return v.ready, v.reason


def test_a_shard_without_leader_makes_the_node_unready() -> None:
    assert ready([status(leader=None)], CatchUp()) == (False, "shard g1 has no leader")


def test_catch_up_target_is_the_commit_index_seen_with_the_first_leader() -> None:
    cu = CatchUp()
    assert ready([status(commit=100, applied=40)], cu)[0] is False
    # The commit index moved on, but the target stays where it was first seen.
    assert ready([status(commit=150, applied=99)], cu) == (
        False,
        "shard g1 is catching up (applied 99 of 100)",
    )
    assert ready([status(commit=160, applied=100)], cu) == (True, "")


def test_caught_up_is_latched_so_apply_lag_under_load_keeps_the_node_ready() -> None:
    cu = CatchUp()
    assert ready([status()], cu)[0]
    assert ready([status(commit=5000, applied=10)], cu)[0]
    # ...but losing the leader does take it out.
    assert not ready([status(leader=None)], cu)[0]


def test_every_shard_counts() -> None:
    cu = CatchUp()
    ok, reason = ready([status("g1"), status("g2", commit=9, applied=3)], cu)
    assert (ok, reason) == (False, "shard g2 is catching up (applied 3 of 9)")


def test_joining_etcd_matters_only_when_etcd_is_configured() -> None:
    cu = CatchUp()
    assert ready([status()], cu, etcd_configured=False, etcd_joined=False)[0]
    assert ready([status()], cu, etcd_configured=True, etcd_joined=False) == (
        False,
        "not registered in etcd yet (cluster metadata unreachable)",
    )
    assert ready([status()], cu, etcd_configured=True, etcd_joined=True)[0]


def test_stopping_and_not_serving_are_unready() -> None:
    assert ready([status()], CatchUp(), stopping=True) == (False, "shutting down")
    assert ready([status()], CatchUp(), serving=False)[1] == "gRPC server not serving yet"


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(health_mod).failed == 0
