"""Placement policy: pure functions, no I/O, time as an input.

The controller (``controller.py``) reads nodes and groups from the metadata store and writes
back the records these functions return; each group's Raft leader then makes its membership
match its record, one change at a time (``membership_step``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fluxmq.metadata import NodeInfo, ShardRecord


@dataclass(frozen=True, slots=True)
class Replacement:
    """A member of a group replaced by a live node (the group's new record), because it was
    dead (missing for ``dead_after_ms``) or leaving (drained or decommissioned)."""

    group_id: str
    dead: str  # the member replaced
    target: str
    record: ShardRecord
    reason: str = "dead_node"  # or "drain"


def missing_members(records: Mapping[str, ShardRecord], live: Mapping[str, NodeInfo]) -> set[str]:
    """Members of some group that the directory does not list (down, or gone for good)."""
    return {m for r in records.values() for m in r.members if m not in live}


def hosted_counts(
    records: Mapping[str, ShardRecord], nodes: Mapping[str, NodeInfo]
) -> dict[str, int]:
    counts = {n: 0 for n in nodes}
    for r in records.values():
        for m in r.members:
            if m in counts:
                counts[m] += 1
    return counts


def free_port(node: NodeInfo, used: set[int]) -> int:
    """The node's lowest Raft port above its base (the base is its home group's) not in use."""
    port = node.raft_port_base + 1
    while port in used:
        port += 1
    return port


def plan_replacements(
    records: Mapping[str, ShardRecord],
    live: Mapping[str, NodeInfo],
    missing_since_ms: Mapping[str, int],
    now_ms: int,
    dead_after_ms: int,
    used_ports: Mapping[str, set[int]],
    moves_max: int,
    unmanaged: frozenset[str] = frozenset(),
    leaving: frozenset[str] = frozenset(),
) -> list[Replacement]:
    """New records for groups with a member missing for at least ``dead_after_ms``, or
    ``leaving`` (being drained or decommissioned): that member replaced by the live node, not
    leaving, that hosts the fewest groups and is not a member yet (a group's replicas stay on
    distinct nodes), on a free Raft port of that node. One member per group at a time, the
    dead before the leaving; at most ``moves_max`` groups per call; groups in ``unmanaged``
    (whose members come from the nodes' configuration) are left alone. A group with no node
    to take the replica keeps its record (it stays under-replicated until a node joins). A
    leaving member is not moved while another member of its group is missing: the move adds a
    replica before it removes one, and the group would wait for the newcomer to catch up.

    >>> n = {i: NodeInfo(i, f"h:{i}", "h", 7100 + 100 * k, 0) for k, i in enumerate("abcd")}
    >>> g1 = ShardRecord("g1", ("a", "b", "c"), {"a": 7101, "b": 7201, "c": 7301}, 3, 0)
    >>> live = {i: n[i] for i in "abd"}  # c is gone
    >>> plan_replacements({"g1": g1}, live, {"c": 1_000}, 50_000, 60_000, {}, 2)
    []
    >>> [r] = plan_replacements({"g1": g1}, live, {"c": 1_000}, 61_000, 60_000, {}, 2)
    >>> r.dead, r.target, r.record.members, r.record.raft_ports["d"], r.reason
    ('c', 'd', ('a', 'b', 'd'), 7401, 'dead_node')
    >>> [r] = plan_replacements({"g1": g1}, n, {}, 0, 60_000, {}, 2, leaving=frozenset("a"))
    >>> r.dead, r.target, r.reason  # a drained: d takes its place
    ('a', 'd', 'drain')
    """
    counts = hosted_counts(records, live)
    ports = {n: set(p) for n, p in used_ports.items()}
    out: list[Replacement] = []
    for group_id, record in sorted(records.items()):
        if len(out) >= moves_max:
            break
        if group_id in unmanaged:
            continue
        missing = [m for m in record.members if m not in live]
        dead = sorted(
            m for m in missing if now_ms - missing_since_ms.get(m, now_ms) >= dead_after_ms
        )
        going = sorted(m for m in record.members if m in leaving and m in live)
        if dead:
            gone, reason = dead[0], "dead_node"
        elif going and not missing:
            gone, reason = going[0], "drain"
        else:
            continue
        candidates = sorted(
            (
                n
                for n in live.values()
                if n.node_id not in record.members and n.node_id not in leaving
            ),
            key=lambda n: (counts[n.node_id], n.node_id),
        )
        if not candidates:
            continue
        target = candidates[0]
        taken = ports.setdefault(target.node_id, set())
        port = free_port(target, taken)
        taken.add(port)
        members = tuple(sorted((*(m for m in record.members if m != gone), target.node_id)))
        raft_ports = {m: p for m, p in record.raft_ports.items() if m != gone}
        raft_ports[target.node_id] = port
        out.append(
            Replacement(
                group_id,
                gone,
                target.node_id,
                replace(record, members=members, raft_ports=raft_ports),
                reason,
            )
        )
        counts[target.node_id] += 1
    return out


def membership_step(
    wanted: set[str], current: set[str], connected: set[str], caught_up: set[str], leader: str
) -> tuple[str, str] | None:
    """The next single Raft membership change that moves ``current`` (the group's Raft
    members, by address) toward ``wanted`` (its record), as its leader ``leader`` sees it:
    ("remove", address), ("add", address), ("transfer", address) when the leader itself must
    go (it hands leadership to a caught-up member of the record first), or None when nothing is
    to do or to do yet.

    A member that is not connected (dead) is removed first: the group then needs fewer
    acknowledgements, and the node added next catches up while the others commit. A leader
    that is not in the record hands over before anything is added (the new replica knows the
    record's members only, and takes appends from them alone). A live member is removed only
    after every added one is caught up (a drain: add, catch up, remove), so the group never
    drops below a majority of replicas holding the log.

    >>> membership_step({"a", "b", "d"}, {"a", "b", "c"}, {"a", "b", "d"}, {"a", "b"}, "a")
    ('remove', 'c')
    >>> membership_step({"a", "b", "d"}, {"a", "b"}, {"a", "b", "d"}, {"a", "b"}, "a")
    ('add', 'd')
    >>> four = {"a", "b", "c", "d"}
    >>> membership_step({"a", "b", "d"}, four, four, {"a", "b"}, "a")  # d still catching up
    >>> membership_step({"a", "b", "d"}, four, four, {"a", "b", "d"}, "a")
    ('remove', 'c')
    >>> membership_step({"b", "c", "d"}, {"a", "b", "c"}, four, {"a", "b", "c"}, "a")
    ('transfer', 'b')
    """
    gone = sorted(current - wanted)
    dead = [m for m in gone if m not in connected and m != leader]
    if dead:
        return ("remove", dead[0])
    if leader not in wanted:
        heirs = sorted(wanted & current & caught_up)
        return ("transfer", heirs[0]) if heirs else None
    new = sorted(wanted - current)
    if new:
        return ("add", new[0])
    if not gone or not wanted <= caught_up:
        return None  # nothing to do, or the new replicas are still catching up
    return ("remove", gone[0])
