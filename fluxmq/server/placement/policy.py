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


def moved(record: ShardRecord, gone: str, target: str, port: int) -> ShardRecord:
    """``record`` with ``target`` (on Raft port ``port``) in ``gone``'s place."""
    members = tuple(sorted((*(m for m in record.members if m != gone), target)))
    raft_ports = {m: p for m, p in record.raft_ports.items() if m != gone}
    raft_ports[target] = port
    return replace(record, members=members, raft_ports=raft_ports)


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
        out.append(
            Replacement(
                group_id, gone, target.node_id, moved(record, gone, target.node_id, port), reason
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


def plan_rebalance(
    records: Mapping[str, ShardRecord],
    live: Mapping[str, NodeInfo],
    used_ports: Mapping[str, set[int]],
    moves_max: int,
    unmanaged: frozenset[str] = frozenset(),
    leaving: frozenset[str] = frozenset(),
) -> list[Replacement]:
    """Moves that even out the replicas of placed groups over the live nodes (not leaving),
    e.g. after a node joined: while the most loaded node holds two or more replicas than the
    least loaded, one of its replicas moves there (a group it is a member of and the other is
    not, whose members are all live). At most ``moves_max``; an even cluster gets none.

    >>> n = {i: NodeInfo(i, f"h:{i}", "h", 7100 + 100 * k, 0) for k, i in enumerate("abcd")}
    >>> def g(gid, *m): return ShardRecord(gid, m, {x: 7150 for x in m}, 3, 0)
    >>> records = {"g1": g("g1", "a", "b", "c"), "g2": g("g2", "a", "b", "c")}
    >>> [(r.group_id, r.dead, r.target) for r in plan_rebalance(records, n, {}, 4)]
    [('g1', 'a', 'd')]
    >>> plan_rebalance({"g1": g("g1", "a", "b", "c")}, n, {}, 4)  # 1,1,1,0: even enough
    []
    """
    eligible = {i: node for i, node in live.items() if i not in leaving}
    counts = {i: 0 for i in eligible}
    for gid, record in records.items():
        if gid in unmanaged:
            continue
        for m in record.members:
            if m in counts:
                counts[m] += 1
    ports = {i: set(p) for i, p in used_ports.items()}
    planned: set[str] = set()
    out: list[Replacement] = []
    while len(out) < moves_max and counts:
        found = None
        for heavy in sorted(counts, key=lambda i: (-counts[i], i)):
            for light in sorted(counts, key=lambda i: (counts[i], i)):
                if counts[heavy] - counts[light] < 2:
                    break
                for gid, record in sorted(records.items()):
                    if (
                        gid in unmanaged
                        or gid in planned
                        or heavy not in record.members
                        or light in record.members
                        or any(m not in live for m in record.members)
                    ):
                        continue
                    found = (gid, record, heavy, light)
                    break
                if found:
                    break
            if found:
                break
        if found is None:
            break
        gid, record, heavy, light = found
        taken = ports.setdefault(light, set())
        port = free_port(eligible[light], taken)
        taken.add(port)
        out.append(Replacement(gid, heavy, light, moved(record, heavy, light, port), "rebalance"))
        planned.add(gid)
        counts[heavy] -= 1
        counts[light] += 1
    return out


def plan_leaders(
    records: Mapping[str, ShardRecord],
    leaders: Mapping[str, str],
    live: Mapping[str, NodeInfo],
    moves_max: int,
    leaving: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Preferred leaders that spread leadership: a node leading more than
    ceil(groups / eligible nodes) + 1 groups gives groups to the live members (not leaving) that
    lead fewer than that ceiling, the fewest first, until it leads the ceiling (the slack of one
    before acting avoids moving leaders back and forth over a difference of one).
    ``leaders``: group -> the node leading it now. -> group -> the node it should be led by
    (only the groups to move; at most ``moves_max``).

    >>> n = {i: NodeInfo(i, f"h:{i}", "h", 7100, 0) for i in "abc"}
    >>> def g(gid): return ShardRecord(gid, ("a", "b", "c"), {x: 7150 for x in "abc"}, 3, 0)
    >>> records = {x: g(x) for x in ("g1", "g2", "g3", "g4")}
    >>> plan_leaders(records, {"g1": "a", "g2": "a", "g3": "a", "g4": "a"}, n, 4)
    {'g1': 'b', 'g2': 'c'}
    >>> plan_leaders(records, {"g1": "a", "g2": "a", "g3": "b", "g4": "c"}, n, 4)
    {}
    """
    eligible = [i for i in live if i not in leaving]
    if not eligible:
        return {}
    led = {i: 0 for i in eligible}
    for gid, node in leaders.items():
        if gid in records and node in led:
            led[node] += 1
    cap = -(-len([g for g in records if g in leaders]) // len(eligible))
    # Over the cap by more than one: brought down to the cap.
    donors = {n for n, count in led.items() if count > cap + 1}
    out: dict[str, str] = {}
    for gid in sorted(records):
        if len(out) >= moves_max:
            break
        current = leaders.get(gid, "")
        if current not in donors or led[current] <= cap:
            continue
        heirs = [m for m in records[gid].members if m in led and m != current and led[m] < cap]
        if not heirs:
            continue
        heir = min(heirs, key=lambda m: (led[m], m))
        out[gid] = heir
        led[current] -= 1
        led[heir] += 1
    return out
