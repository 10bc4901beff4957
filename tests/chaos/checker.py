"""The pure checker of a chaos schedule: given what producers sent, what the final drain read back,
what every replica reports and what the consumer group did, name every broken guarantee.

No I/O, no clocks, no gRPC: the harness records the history, these functions judge it, so the
judgement itself can be unit-tested with planted faults (tests/chaos/test_checker.py).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

ACKED = "acked"
UNKNOWN = "unknown"
_OUTCOMES = frozenset({ACKED, UNKNOWN})
SUMMARY_ITEMS_MAX = 20

Position = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True, slots=True)
class Sent:
    msg_id: str
    producer: str
    seq: int  # per producer, increasing in send order
    outcome: str  # "acked" or "unknown" (the answer was lost: it may or may not be stored)


@dataclass(frozen=True, slots=True)
class Read:
    msg_id: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ReplicaState:
    node: str
    shard: str
    applied_index: int
    digest: str


@dataclass(frozen=True, slots=True)
class Lease:
    consumer: str
    partition: int
    offset: int
    received_ms: int
    deadline_ms: int
    settled_ms: int | None


@dataclass(frozen=True, slots=True)
class AckResult:
    partition: int
    offset: int
    status: str


def _acked_ids(sent: Iterable[Sent]) -> set[str]:
    # A typo in an outcome would silently turn every message into "unknown" and hide every loss.
    acked: set[str] = set()
    for s in sent:
        if s.outcome not in _OUTCOMES:
            raise ValueError(f"Sent {s.msg_id}: outcome {s.outcome!r} is not one of {_OUTCOMES}")
        if s.outcome == ACKED:
            acked.add(s.msg_id)
    return acked


def _positions_by_id(reads: Iterable[Read]) -> dict[str, set[Position]]:
    positions: dict[str, set[Position]] = defaultdict(set)
    for r in reads:
        positions[r.msg_id].add((r.partition, r.offset))
    return positions


def find_lost(sent: Iterable[Sent], reads: Iterable[Read]) -> list[str]:
    """msg_ids acknowledged to their producer that the drain never read back."""
    read_ids = {r.msg_id for r in reads}
    return sorted(_acked_ids(sent) - read_ids)


def find_duplicates(reads: Iterable[Read]) -> dict[str, list[Position]]:
    """msg_ids stored at two or more distinct (partition, offset) positions, with their positions.

    Reading one position twice is not a duplicate (a drain may re-read a record):

    >>> find_duplicates([Read("a", 0, 1), Read("a", 0, 1), Read("b", 0, 2)])
    {}
    >>> find_duplicates([Read("a", 1, 5), Read("b", 0, 2), Read("a", 0, 3)])
    {'a': [(0, 3), (1, 5)]}
    """
    positions = _positions_by_id(reads)
    return {m: sorted(ps) for m, ps in sorted(positions.items()) if len(ps) >= 2}


def find_unexpected(sent: Iterable[Sent], reads: Iterable[Read]) -> list[str]:
    """msg_ids read back that no producer ever sent."""
    sent_ids = {s.msg_id for s in sent}
    return sorted({r.msg_id for r in reads} - sent_ids)


def find_reorders(sent: Iterable[Sent], reads: Iterable[Read]) -> list[str]:
    """Each producer's acked messages in one partition must sit at increasing offsets in seq order.

    Messages with outcome "unknown" are left out: a call whose answer was lost may have been
    stored after a later call that went to another node. A message stored twice counts at its
    first offset (the duplicate itself is reported by find_duplicates).

    >>> sent = [Sent("p1-7", "p1", 7, "acked"), Sent("p1-8", "p1", 8, "acked")]
    >>> find_reorders(sent, [Read("p1-8", 2, 29), Read("p1-7", 2, 30)])
    ['p1 partition 2: seq 7 at offset 30 after seq 8 at offset 29']
    >>> find_reorders(sent, [Read("p1-7", 2, 29), Read("p1-8", 2, 30)])
    []
    """
    sent = list(sent)
    _acked_ids(sent)  # validates the outcomes
    first_offset: dict[str, dict[int, int]] = defaultdict(dict)  # msg_id -> partition -> offset
    for r in reads:
        by_partition = first_offset[r.msg_id]
        by_partition[r.partition] = min(r.offset, by_partition.get(r.partition, r.offset))
    by_stream: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for s in sent:
        if s.outcome != ACKED:
            continue
        for partition, offset in first_offset.get(s.msg_id, {}).items():
            by_stream[(s.producer, partition)].append((s.seq, offset))
    violations: list[str] = []
    for (producer, partition), seq_offsets in sorted(by_stream.items()):
        ordered = sorted(set(seq_offsets))
        for (seq_a, off_a), (seq_b, off_b) in itertools.pairwise(ordered):
            if off_a >= off_b:
                violations.append(
                    f"{producer} partition {partition}: seq {seq_a} at offset {off_a}"
                    f" after seq {seq_b} at offset {off_b}"
                )
    return violations


def find_divergence(states: Iterable[ReplicaState]) -> list[str]:
    """Replicas of one shard at the same applied index must hold the same digest."""
    digests: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    for st in states:
        digests[(st.shard, st.applied_index)][st.node] = st.digest
    lines: list[str] = []
    for (shard, index), by_node in sorted(digests.items()):
        if len(set(by_node.values())) > 1:
            nodes = ", ".join(f"{node}={digest}" for node, digest in sorted(by_node.items()))
            lines.append(f"shard {shard} index {index}: digests differ: {nodes}")
    return lines


# The status of a receipt whose ack call failed without an answer: it may have been applied,
# and then no "ACKED" is ever seen for it (a later ack gets ALREADY_ACKED, or none is made).
OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"


def _ack_violations(reads: Iterable[Read], acks: Iterable[AckResult]) -> list[str]:
    read_positions = {(r.partition, r.offset) for r in reads}
    acked_count: dict[Position, int] = defaultdict(int)
    unanswered: set[Position] = set()
    for a in acks:
        if a.status == "ACKED":
            acked_count[(a.partition, a.offset)] += 1
        elif a.status == OUTCOME_UNKNOWN:
            unanswered.add((a.partition, a.offset))
    lines: list[str] = []
    for pos in sorted(read_positions | acked_count.keys()):
        count = acked_count.get(pos, 0)
        where = f"partition {pos[0]} offset {pos[1]}"
        if pos not in read_positions:
            lines.append(f"{where}: acked by the group but never read back")
        elif count == 0 and pos not in unanswered:
            lines.append(f"{where}: never acked by the group")
        elif count > 1:
            lines.append(f"{where}: acked {count} times by the group")
    return lines


def _lease_overlaps(leases: Iterable[Lease], lease_slack_ms: int) -> list[str]:
    by_position: dict[Position, list[Lease]] = defaultdict(list)
    for lease in leases:
        by_position[(lease.partition, lease.offset)].append(lease)
    lines: list[str] = []
    for (partition, offset), group in sorted(by_position.items()):
        group.sort(key=lambda x: (x.received_ms, x.consumer))
        for i, first in enumerate(group):
            # A settled lease frees the record early; an unsettled one holds it to its deadline.
            valid_until_ms = min(first.deadline_ms, first.settled_ms or first.deadline_ms)
            for later in group[i + 1 :]:
                if later.consumer == first.consumer:
                    continue
                if later.received_ms < valid_until_ms - lease_slack_ms:
                    lines.append(
                        f"partition {partition} offset {offset}: leased to {later.consumer} at"
                        f" {later.received_ms} ms while {first.consumer}'s lease (received at"
                        f" {first.received_ms} ms) was valid until {valid_until_ms} ms"
                    )
    return lines


def find_group_violations(
    reads: Iterable[Read],
    leases: Iterable[Lease],
    acks: Iterable[AckResult],
    lease_slack_ms: int = 50,
) -> list[str]:
    """Every record read back acked exactly once by the group, no ack of a record the log lacks,
    and no record leased to two consumers while the first lease was valid (minus a clock slack)."""
    return _ack_violations(reads, acks) + _lease_overlaps(leases, lease_slack_ms)


def _listed(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    lines = [f"{title} ({len(items)}):"]
    lines += [f"  {item}" for item in items[:SUMMARY_ITEMS_MAX]]
    if len(items) > SUMMARY_ITEMS_MAX:
        lines.append(f"  ... and {len(items) - SUMMARY_ITEMS_MAX} more")
    return lines


@dataclass(slots=True)
class Verdict:
    lost: list[str] = field(default_factory=list)
    duplicated: dict[str, list[Position]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    reordered: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    acked: int = 0  # distinct msg_ids acknowledged to their producer
    unknown: int = 0  # distinct msg_ids never acknowledged (may or may not be stored)
    unknown_stored: int = 0  # of those, how many the drain found
    read: int = 0  # distinct msg_ids read back

    @property
    def ok(self) -> bool:
        kinds = (self.lost, self.duplicated, self.unexpected, self.reordered, self.divergent)
        return not any(kinds) and not self.group

    def summary(self) -> str:
        head = "OK" if self.ok else "VIOLATIONS"
        lines = [
            f"{head}: acked {self.acked}, unknown {self.unknown} ({self.unknown_stored} stored),"
            f" read {self.read}"
        ]
        duplicated = [f"{m} at {ps}" for m, ps in self.duplicated.items()]
        lines += _listed("lost (acked, never read back)", self.lost)
        lines += _listed("duplicated (read at two positions)", duplicated)
        lines += _listed("unexpected (read, never sent)", self.unexpected)
        lines += _listed("reordered", self.reordered)
        lines += _listed("divergent replicas", self.divergent)
        lines += _listed("consumer group", self.group)
        return "\n".join(lines)


def check(
    sent: Iterable[Sent],
    reads: Iterable[Read],
    states: Iterable[ReplicaState],
    leases: Iterable[Lease],
    acks: Iterable[AckResult],
) -> Verdict:
    """Run every check over one schedule's history."""
    sent, reads = list(sent), list(reads)
    acked = _acked_ids(sent)
    unknown = {s.msg_id for s in sent} - acked
    read_ids = {r.msg_id for r in reads}
    return Verdict(
        lost=find_lost(sent, reads),
        duplicated=find_duplicates(reads),
        unexpected=find_unexpected(sent, reads),
        reordered=find_reorders(sent, reads),
        divergent=find_divergence(states),
        group=find_group_violations(reads, leases, acks),
        acked=len(acked),
        unknown=len(unknown),
        unknown_stored=len(unknown & read_ids),
        read=len(read_ids),
    )


def longest_outage_ms(attempts: Iterable[tuple[int, int, bool]]) -> int:
    """The longest time no publish succeeded, from (start_ms, end_ms, succeeded) attempts.

    Counted from the first attempt's start to the first success, between consecutive successes'
    ends, and from the last success to the end of a failed attempt after it (an outage that
    lasted to the end of the run is still an outage).

    >>> longest_outage_ms([(0, 10, True), (12, 20, False), (15, 90, True), (95, 100, True)])
    80
    """
    attempts = list(attempts)
    if not attempts:
        return 0
    successes = sorted(end for _, end, ok in attempts if ok)
    first_start_ms = min(start for start, _, _ in attempts)
    last_end_ms = max(end for _, end, _ in attempts)
    marks = [first_start_ms, *successes]
    if not successes or last_end_ms > successes[-1]:
        marks.append(last_end_ms)
    return max(b - a for a, b in itertools.pairwise(marks))
