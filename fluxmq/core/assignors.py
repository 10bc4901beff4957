"""Partition assignors for consumer groups: pure functions, deterministic on every replica.

An assignment maps member ids to sorted partition lists; every partition of the queue belongs to
exactly one member (when there is at least one member), and the member counts differ by at most
one. Members are ordered by id, never by arrival, so every replica computes the same result.

Groundwork for server-side group membership (JoinGroup/Heartbeat, issue 5): ``plan_moves`` turns
an old and a new assignment into the incremental steps Kafka's newest protocol uses: a partition
that changes owner is first revoked from its old owner and only granted to the new one once the
old owner released it (or its session expired).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Assignment = dict[str, list[int]]

STRATEGIES = ("range", "round_robin", "sticky")


def _members(members: Sequence[str]) -> list[str]:
    ordered = sorted(set(members))
    assert len(ordered) == len(members), "member ids must be unique"
    return ordered


def range_assign(members: Sequence[str], partitions: int) -> Assignment:
    """Contiguous blocks in member order; the first ``partitions % n`` members get one more.

    >>> range_assign(["c", "a", "b"], 7)
    {'a': [0, 1, 2], 'b': [3, 4], 'c': [5, 6]}
    >>> range_assign([], 3)
    {}
    """
    ordered = _members(members)
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    out: Assignment = {}
    start = 0
    for i, m in enumerate(ordered):
        n = base + (1 if i < extra else 0)
        out[m] = list(range(start, start + n))
        start += n
    return out


def round_robin_assign(members: Sequence[str], partitions: int) -> Assignment:
    """Partition p goes to the (p mod n)-th member in id order.

    >>> round_robin_assign(["b", "a"], 5)
    {'a': [0, 2, 4], 'b': [1, 3]}
    """
    ordered = _members(members)
    out: Assignment = {m: [] for m in ordered}
    for p in range(partitions if ordered else 0):
        out[ordered[p % len(ordered)]].append(p)
    return out


def sticky_assign(
    members: Sequence[str], partitions: int, current: Mapping[str, Sequence[int]]
) -> Assignment:
    """Balanced like the others, moving as few partitions as possible from ``current``.

    Quotas: the first ``partitions % n`` members (id order) may hold one more. Each member keeps
    its current partitions up to its quota (lowest first); freed and unowned partitions go, in
    order, to the members below quota, in id order.

    A fourth member joins three that hold two partitions each: only one partition moves.

    >>> sticky_assign(["a", "b", "c", "d"], 6, {"a": [0, 1], "b": [2, 3], "c": [4, 5]})
    {'a': [0, 1], 'b': [2, 3], 'c': [4], 'd': [5]}

    A member leaves: its partitions are spread, the others keep theirs.

    >>> sticky_assign(["a", "c"], 6, {"a": [0, 1], "b": [2, 3], "c": [4, 5]})
    {'a': [0, 1, 2], 'c': [3, 4, 5]}
    """
    ordered = _members(members)
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(ordered)}
    out: Assignment = {m: [] for m in ordered}
    taken: set[int] = set()
    for m in ordered:
        for p in sorted(set(current.get(m, ()))):
            if 0 <= p < partitions and p not in taken and len(out[m]) < quota[m]:
                out[m].append(p)
                taken.add(p)
    free = (p for p in range(partitions) if p not in taken)
    for m in ordered:
        while len(out[m]) < quota[m]:
            out[m].append(next(free))
        out[m].sort()
    return out


def assign(
    strategy: str,
    members: Sequence[str],
    partitions: int,
    current: Mapping[str, Sequence[int]] | None = None,
) -> Assignment:
    if strategy == "range":
        return range_assign(members, partitions)
    if strategy == "round_robin":
        return round_robin_assign(members, partitions)
    if strategy == "sticky":
        return sticky_assign(members, partitions, current or {})
    raise ValueError(f"unknown assignment strategy {strategy!r} (one of {', '.join(STRATEGIES)})")


@dataclass(frozen=True, slots=True)
class Moves:
    keep: dict[str, list[int]]  # owned before and after
    revoke: dict[str, list[int]]  # the old owner must release these first
    grant_now: dict[str, list[int]]  # nobody owns them: the new owner may start at once
    grant_after_release: dict[str, list[int]]  # wait for the revoke of the same partition


def plan_moves(old: Mapping[str, Sequence[int]], new: Mapping[str, Sequence[int]]) -> Moves:
    """The incremental steps from ``old`` to ``new``: a partition never has two owners.

    >>> m = plan_moves({"a": [0, 1], "b": [2]}, {"a": [0], "b": [2], "c": [1]})
    >>> m.revoke, m.grant_after_release, m.keep
    ({'a': [1]}, {'c': [1]}, {'a': [0], 'b': [2]})
    """
    owner_before = {p: m for m, ps in old.items() for p in ps}
    keep: dict[str, list[int]] = {}
    revoke: dict[str, list[int]] = {}
    grant_now: dict[str, list[int]] = {}
    later: dict[str, list[int]] = {}
    for m, ps in sorted(new.items()):
        for p in sorted(ps):
            before = owner_before.get(p)
            if before == m:
                keep.setdefault(m, []).append(p)
            elif before is None:
                grant_now.setdefault(m, []).append(p)
            else:
                revoke.setdefault(before, []).append(p)
                later.setdefault(m, []).append(p)
    owner_after = {p for ps in new.values() for p in ps}
    for m, ps in sorted(old.items()):
        for p in sorted(ps):
            if p not in owner_after:  # the partition is gone (or nobody is left)
                revoke.setdefault(m, []).append(p)
    for ps in revoke.values():
        ps.sort()
    return Moves(keep, revoke, grant_now, later)
