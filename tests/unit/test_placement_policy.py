"""Placement policy (fluxmq/server/placement/policy.py): pure functions, checked on seeded
random clusters. A failure prints its seed."""

from __future__ import annotations

import random

import pytest

from fluxmq.metadata import NodeInfo, ShardRecord
from fluxmq.server.placement.policy import (
    membership_step,
    plan_leaders,
    plan_rebalance,
    plan_replacements,
)

SEEDS = range(40)


def nodes(count: int) -> dict[str, NodeInfo]:
    return {f"n{i}": NodeInfo(f"n{i}", f"h:{i}", "h", 7000 + 100 * i, 0) for i in range(count)}


def random_records(
    rng: random.Random, live: dict[str, NodeInfo], groups: int
) -> dict[str, ShardRecord]:
    out = {}
    for g in range(groups):
        members = tuple(sorted(rng.sample(sorted(live), 3)))
        ports = {m: live[m].raft_port_base + 1 + g for m in members}
        out[f"g{g}"] = ShardRecord(f"g{g}", members, ports, 3, 0)
    return out


def used_ports(records: dict[str, ShardRecord]) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for r in records.values():
        for m, p in r.raft_ports.items():
            used.setdefault(m, set()).add(p)
    return used


def check_records(records: dict[str, ShardRecord], seed: int) -> None:
    per_node: dict[str, list[int]] = {}
    for r in records.values():
        assert len(set(r.members)) == len(r.members) == 3, (seed, r)
        assert set(r.raft_ports) == set(r.members), (seed, r)
        for m, p in r.raft_ports.items():
            per_node.setdefault(m, []).append(p)
    for node_id, ports in per_node.items():
        assert len(ports) == len(set(ports)), f"seed {seed}: {node_id} has a port twice: {ports}"


@pytest.mark.parametrize("seed", SEEDS)
def test_replacing_dead_and_draining_members_keeps_replicas_on_distinct_nodes_and_ports(
    seed: int,
) -> None:
    rng = random.Random(seed)
    everyone = nodes(rng.randint(4, 7))
    records = random_records(rng, everyone, rng.randint(1, 6))
    dead = set(rng.sample(sorted(everyone), 1))
    leaving = frozenset(rng.sample(sorted(set(everyone) - dead), rng.randint(0, 1)))
    live = {n: i for n, i in everyone.items() if n not in dead}
    for _ in range(20):  # passes of the controller, each writing what it planned
        plans = plan_replacements(
            records,
            live,
            dict.fromkeys(dead, 0),
            10**9,
            1000,
            used_ports(records),
            2,
            leaving=leaving,
        )
        if not plans:
            break
        for p in plans:
            assert p.target in live and p.target not in leaving, (seed, p)
            records[p.group_id] = p.record
        check_records(records, seed)
    for r in records.values():
        assert not (set(r.members) & (dead | leaving)) or len(live) - len(leaving) < 3, (seed, r)


@pytest.mark.parametrize("seed", SEEDS)
def test_rebalancing_evens_replicas_out_within_one(seed: int) -> None:
    rng = random.Random(seed)
    live = nodes(rng.randint(3, 6))
    records = random_records(
        rng, dict(list(live.items())[:3]), rng.randint(1, 8)
    )  # 3 nodes had it all
    for _ in range(50):
        plans = plan_rebalance(records, live, used_ports(records), 2)
        if not plans:
            break
        for p in plans:
            records[p.group_id] = p.record
        check_records(records, seed)
    counts = {n: sum(n in r.members for r in records.values()) for n in live}
    # A node holding two more than another is in at least two groups the other is not in.
    assert max(counts.values()) - min(counts.values()) <= 1, (seed, counts)


@pytest.mark.parametrize("seed", SEEDS)
def test_leaders_are_brought_within_one_of_even(seed: int) -> None:
    rng = random.Random(seed)
    live = nodes(rng.randint(3, 5))
    records = random_records(rng, live, rng.randint(2, 9))
    leaders = {g: r.members[0] for g, r in records.items()}  # worst case: the first member
    for _ in range(20):
        moves = plan_leaders(records, leaders, live, 2)
        if not moves:
            break
        for g, n in moves.items():
            assert n in records[g].members, (seed, g, n)
            leaders[g] = n
    cap = -(-len(records) // len(live))
    led = [sum(v == n for v in leaders.values()) for n in live]
    assert max(led) <= cap + 1, (seed, led)


@pytest.mark.parametrize("seed", SEEDS)
def test_membership_steps_reach_the_record_one_change_at_a_time_never_below_a_live_majority(
    seed: int,
) -> None:
    """The leader's steps, applied one at a time (a new replica catches up one step after it
    is added), reach the record; a live member is removed only once every added one is caught
    up; the leader hands over before it leaves."""
    rng = random.Random(seed)
    pool = [f"a{i}" for i in range(7)]
    current = set(rng.sample(pool, 3))
    dead = set(rng.sample(sorted(current), rng.randint(0, 1)))
    leader = rng.choice(sorted(current - dead))
    wanted = set(rng.sample(sorted(current - dead), 2 - (len(current - dead) < 2))) | set(
        rng.sample([p for p in pool if p not in current], 1)
    )
    caught_up = set(current - dead)
    for step_no in range(20):
        connected = (current | wanted) - dead
        step = membership_step(wanted, current, connected, caught_up & current, leader)
        if step is None:
            if wanted <= caught_up:
                break
            caught_up |= wanted  # the newcomers catch up
            continue
        op, address = step
        if op == "remove":
            assert address != leader, (seed, step_no)
            if address not in dead:
                assert wanted <= caught_up, (
                    f"seed {seed}: removed live {address} before newcomers caught up"
                )
            current.discard(address)
        elif op == "add":
            assert leader in wanted, f"seed {seed}: a leader that leaves added {address}"
            current.add(address)
        else:
            assert address in wanted and address in caught_up, (seed, step)
            leader = address
    assert current == wanted, (seed, current, wanted)
