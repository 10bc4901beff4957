"""Replica shape: do the replicas of a shard agree on each partition's watermarks? (No Spark: the
logs table has one row per partition and store, so the audit collects it and decides here.)

Raft applies one log in one order on every replica, and a partition's watermarks only move up
as entries apply (appends raise ``high``, retention and purges raise ``low``). So, for two
replicas of one shard that applied up to indexes ``a`` and ``b``:

- ``a == b``: they hold the same ``[low, high)`` of every partition, and the same partitions;
- ``a < b``: the one behind has ``low`` and ``high`` no greater than the one ahead (it may lack
  a partition the other created since, or still hold one the other deleted since).

A replica that breaks this holds records the others lack (a write that did not come through
Raft), or lost some that a watermark no longer covers, which no other rule can see: each log
is contiguous in itself. Among replicas at the same applied index the shape most of them share
is taken as right (a tie: the one with fewer records, since extra records are the suspect ones),
and each other replica is a violation naming it. A store that recorded no applied index (a
single node of an old version) is compared with none, nor is a log whose metadata is damaged
(``offset_contiguity`` reports that).

Worked example: three replicas of shard ``s1`` applied to index 90; partition 0 of ``orders``
holds ``[0, 400)`` on ``n1`` and ``n2`` and ``[0, 450)`` on ``n3``:

>>> rows = [
...     LogShape("n1", "s1", "orders", 1, 0, 0, 400, 90),
...     LogShape("n2", "s1", "orders", 1, 0, 0, 400, 90),
...     LogShape("n3", "s1", "orders", 1, 0, 0, 450, 90),
... ]
>>> [(v.node, v.offset, v.detail) for v in shape_violations(rows)]
[('n3', 400, 'holds offsets [0, 450) where n1,n2 at the same applied index 90 hold [0, 400)')]

Had ``n3`` applied to index 95 instead, ``[0, 450)`` would be fine (it is ahead); had ``n1``
applied only to 80 with ``[0, 420)``, it would be named: a replica behind cannot hold more.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

Shape = tuple[int, int] | None  # (low, high), or None: the store has no such log


@dataclass(frozen=True, slots=True)
class LogShape:
    node: str
    replication_group: str
    queue: str | None
    queue_id: int
    partition: int
    low: int
    high: int
    applied_index: int | None
    damaged: bool = False  # its metadata failed its check (offset_contiguity reports it)


@dataclass(frozen=True, slots=True)
class ShapeViolation:
    node: str
    replication_group: str
    queue: str | None
    partition: int
    offset: int | None  # the first offset it holds that the others lack, where there is one
    detail: str


def _text(shape: Shape) -> str:
    return "no log for this partition" if shape is None else f"[{shape[0]}, {shape[1]})"


def _majority(shapes: dict[str, Shape]) -> Shape:
    """The shape most replicas hold; ties go to the one with fewer records (absent first)."""
    counts = Counter(shapes.values())

    def rank(s: Shape) -> tuple[int, int, int]:
        return (-counts[s], -1 if s is None else s[1] - s[0], -1 if s is None else s[1])

    return min(counts, key=rank)


def _first_extra(s: Shape, right: Shape) -> int | None:
    """The first offset ``s`` holds that ``right`` does not (None: it holds nothing extra)."""
    if s is None:
        return None
    if right is None:
        return s[0]
    if s[0] < right[0]:
        return s[0]
    above = max(right[1], s[0])
    return above if above < s[1] else None


def shape_violations(rows: list[LogShape]) -> list[ShapeViolation]:
    """The replicas that break the rule above, one violation per (replica, partition)."""
    applied: dict[tuple[str, str], int | None] = {}
    logs: dict[tuple[str, int, int], dict[str, LogShape]] = defaultdict(dict)
    for r in rows:
        applied[(r.replication_group, r.node)] = r.applied_index
        logs[(r.replication_group, r.queue_id, r.partition)][r.node] = r
    out: list[ShapeViolation] = []
    for (group, _queue_id, partition), held in sorted(logs.items()):
        nodes = {
            n: a
            for (g, n), a in applied.items()
            if g == group and a is not None and not (n in held and held[n].damaged)
        }
        if len(nodes) < 2:
            continue
        queue = next(iter(held.values())).queue
        shapes: dict[str, Shape] = {
            n: ((held[n].low, held[n].high) if n in held else None) for n in nodes
        }
        found = _at_one_index(nodes, shapes)
        named = {n for n, _offset, _detail in found}
        found += _behind(nodes, shapes, named)
        out += [ShapeViolation(n, group, queue, partition, o, d) for n, o, d in found]
    return out


Found = list[tuple[str, int | None, str]]  # node, first offset it holds extra, detail


def _at_one_index(nodes: dict[str, int], shapes: dict[str, Shape]) -> Found:
    """Replicas at the same applied index whose shape is not the one most of them hold."""
    by_index: dict[int, list[str]] = defaultdict(list)
    for n, a in nodes.items():
        by_index[a].append(n)
    found: Found = []
    for index, peers in sorted(by_index.items()):
        if len(peers) < 2 or len({shapes[n] for n in peers}) == 1:
            continue
        right = _majority({n: shapes[n] for n in peers})
        keepers = ",".join(sorted(n for n in peers if shapes[n] == right))
        for n in sorted(peers):
            s = shapes[n]
            if s != right:
                detail = (
                    f"holds {'offsets ' if s else ''}{_text(s)} where {keepers} at the same "
                    f"applied index {index} hold {_text(right)}"
                )
                found.append((n, _first_extra(s, right), detail))
    return found


def _behind(nodes: dict[str, int], shapes: dict[str, Shape], named: set[str]) -> Found:
    """Replicas (not named already) holding above, or having removed below, what a replica
    that applied further holds: the nearest such replica ahead is named in the detail."""
    found: Found = []
    for n, a in sorted(nodes.items()):
        s = shapes[n]
        if n in named or s is None:
            continue
        for m, b in sorted(nodes.items(), key=lambda nb: (nb[1], nb[0])):
            t = shapes[m]
            if b <= a or t is None or (s[1] <= t[1] and s[0] <= t[0]):
                continue
            offset: int | None
            if s[1] > t[1]:
                what, offset = f"holds offsets [{max(t[1], s[0])}, {s[1]})", max(t[1], s[0])
                there = "does not hold"
            else:
                what, offset = f"lacks offsets [{t[0]}, {min(s[0], t[1])})", None
                there = "still holds"
            detail = (
                f"{what} at applied index {a}, which {m}, applied further (to {b}), "
                f"{there}: {_text(s)} here, {_text(t)} there"
            )
            found.append((n, offset, detail))
            break
    return found
