"""The chaos checker finds every planted fault and passes a clean history (with lost answers,
re-reads and an expired lease taken over): a checker that cannot fail guards nothing."""

from __future__ import annotations

import dataclasses
import doctest

import pytest

from tests.chaos import checker
from tests.chaos.checker import (
    OUTCOME_UNKNOWN,
    AckResult,
    Lease,
    Read,
    ReplicaState,
    Sent,
    Verdict,
    check,
    find_divergence,
    find_duplicates,
    find_group_violations,
    find_lost,
    find_reorders,
    find_unexpected,
    longest_outage_ms,
)


@dataclasses.dataclass
class History:
    sent: list[Sent]
    reads: list[Read]
    states: list[ReplicaState]
    leases: list[Lease]
    acks: list[AckResult]

    def verdict(self) -> Verdict:
        return check(self.sent, self.reads, self.states, self.leases, self.acks)


def _clean() -> History:
    """Two producers over two partitions. p1-3's answer was lost but it was stored; p2-2's answer
    was lost and it was not stored; the drain read p1-1 twice; c1's lease of (0, 0) expired and
    c2 took it after; c1 settled (1, 0) early and c2 re-leased it right after; c1 leased (1, 2)
    twice (its own retry while its lease was valid)."""
    sent = [
        Sent("p1-1", "p1", 1, "acked"),
        Sent("p1-2", "p1", 2, "acked"),
        Sent("p1-3", "p1", 3, "unknown"),
        Sent("p1-4", "p1", 4, "acked"),
        Sent("p2-1", "p2", 1, "acked"),
        Sent("p2-2", "p2", 2, "unknown"),
        Sent("p2-3", "p2", 3, "acked"),
    ]
    reads = [
        Read("p1-1", 0, 0),
        Read("p1-1", 0, 0),  # a re-read of the same position
        Read("p2-1", 0, 1),
        Read("p1-3", 0, 2),
        Read("p1-2", 1, 0),
        Read("p2-3", 1, 1),
        Read("p1-4", 1, 2),
    ]
    states = [
        ReplicaState("n1", "s0", 40, "d40"),
        ReplicaState("n2", "s0", 40, "d40"),
        ReplicaState("n3", "s0", 38, "d38"),  # behind: not compared with the others
        ReplicaState("n1", "s1", 12, "e12"),
        ReplicaState("n2", "s1", 12, "e12"),
    ]
    leases = [
        Lease("c1", 0, 0, received_ms=1_000, deadline_ms=6_000, settled_ms=None),
        Lease("c2", 0, 0, received_ms=6_000, deadline_ms=11_000, settled_ms=6_100),
        Lease("c1", 1, 0, received_ms=1_000, deadline_ms=6_000, settled_ms=1_200),
        Lease("c2", 1, 0, received_ms=1_300, deadline_ms=6_300, settled_ms=None),
        Lease("c1", 1, 2, received_ms=1_000, deadline_ms=6_000, settled_ms=None),
        Lease("c1", 1, 2, received_ms=1_100, deadline_ms=6_100, settled_ms=1_150),
    ]
    acks = [AckResult(p, o, "ACKED") for p, o in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]]
    acks += [AckResult(1, 0, "ALREADY_ACKED"), AckResult(0, 0, "STALE")]
    return History(sent, reads, states, leases, acks)


def _only(verdict: Verdict, kind: str) -> None:
    """The planted fault is reported, and nothing else is."""
    for other in ("lost", "duplicated", "unexpected", "reordered", "divergent", "group"):
        assert bool(getattr(verdict, other)) == (other == kind), (other, verdict.summary())
    assert not verdict.ok


def test_a_clean_history_passes() -> None:
    verdict = _clean().verdict()
    assert verdict.ok, verdict.summary()
    assert (verdict.acked, verdict.unknown, verdict.unknown_stored, verdict.read) == (5, 2, 1, 6)
    assert verdict.summary().startswith("OK: acked 5, unknown 2 (1 stored), read 6")


def test_a_planted_loss_is_found() -> None:
    h = _clean()
    h.reads = [r for r in h.reads if r.msg_id != "p2-3"]
    h.acks = [a for a in h.acks if (a.partition, a.offset) != (1, 1)]
    assert find_lost(h.sent, h.reads) == ["p2-3"]
    _only(h.verdict(), "lost")


def test_a_planted_duplicate_is_found() -> None:
    h = _clean()
    h.reads.append(Read("p1-4", 1, 3))
    h.acks.append(AckResult(1, 3, "ACKED"))
    assert find_duplicates(h.reads) == {"p1-4": [(1, 2), (1, 3)]}
    _only(h.verdict(), "duplicated")


def test_a_duplicate_across_partitions_is_found() -> None:
    reads = [Read("p1-1", 0, 5), Read("p1-1", 1, 5)]
    assert find_duplicates(reads) == {"p1-1": [(0, 5), (1, 5)]}


def test_a_planted_reorder_is_found() -> None:
    h = _clean()
    h.reads = [
        Read("p1-2", 1, 2)
        if r.msg_id == "p1-4"
        else Read("p1-4", 1, 0)
        if r.msg_id == "p1-2"
        else r
        for r in h.reads
    ]
    assert find_reorders(h.sent, h.reads) == [
        "p1 partition 1: seq 2 at offset 2 after seq 4 at offset 0"
    ]
    _only(h.verdict(), "reordered")


def test_order_is_per_partition_and_a_duplicate_counts_at_its_first_offset() -> None:
    sent = [Sent("p1-1", "p1", 1, "acked"), Sent("p1-2", "p1", 2, "acked")]
    across = [Read("p1-1", 1, 9), Read("p1-2", 0, 0)]
    assert find_reorders(sent, across) == []
    late_copy = [Read("p1-1", 0, 0), Read("p1-2", 0, 1), Read("p1-1", 0, 2)]
    assert find_reorders(sent, late_copy) == []


def test_an_unexpected_message_is_found() -> None:
    h = _clean()
    h.reads.append(Read("ghost", 0, 3))
    h.acks.append(AckResult(0, 3, "ACKED"))
    assert find_unexpected(h.sent, h.reads) == ["ghost"]
    _only(h.verdict(), "unexpected")


def test_divergent_replicas_are_found() -> None:
    h = _clean()
    h.states.append(ReplicaState("n3", "s1", 12, "bad"))
    assert find_divergence(h.states) == [
        "shard s1 index 12: digests differ: n1=e12, n2=e12, n3=bad"
    ]
    _only(h.verdict(), "divergent")


def test_a_message_acked_twice_by_the_group_is_found() -> None:
    h = _clean()
    h.acks.append(AckResult(0, 1, "ACKED"))
    assert find_group_violations(h.reads, h.leases, h.acks) == [
        "partition 0 offset 1: acked 2 times by the group"
    ]
    _only(h.verdict(), "group")


def test_a_message_never_acked_by_the_group_is_found() -> None:
    h = _clean()
    h.acks = [a for a in h.acks if (a.partition, a.offset) != (1, 2)]
    assert find_group_violations(h.reads, h.leases, h.acks) == [
        "partition 1 offset 2: never acked by the group"
    ]
    _only(h.verdict(), "group")


def test_a_message_whose_ack_answer_was_lost_is_not_called_unacked() -> None:
    # The ack may have been applied (the drain then finds the group done): no ACKED is ever
    # seen for it, and that is not a violation; an ALREADY_ACKED alone still is.
    h = _clean()
    h.acks = [a for a in h.acks if (a.partition, a.offset) != (1, 2)]
    h.acks += [AckResult(1, 2, OUTCOME_UNKNOWN), AckResult(1, 2, "ALREADY_ACKED")]
    assert find_group_violations(h.reads, h.leases, h.acks) == []
    h.acks = [a for a in h.acks if a.status != OUTCOME_UNKNOWN]
    assert find_group_violations(h.reads, h.leases, h.acks) == [
        "partition 1 offset 2: never acked by the group"
    ]


def test_an_ack_of_a_record_the_log_lacks_is_found() -> None:
    h = _clean()
    h.acks.append(AckResult(1, 7, "ACKED"))
    assert find_group_violations(h.reads, h.leases, h.acks) == [
        "partition 1 offset 7: acked by the group but never read back"
    ]


def test_a_message_leased_to_two_consumers_at_once_is_found() -> None:
    h = _clean()
    h.leases.append(Lease("c2", 0, 2, received_ms=2_000, deadline_ms=7_000, settled_ms=2_100))
    h.leases.append(Lease("c1", 0, 2, received_ms=1_000, deadline_ms=6_000, settled_ms=None))
    lines = find_group_violations(h.reads, h.leases, h.acks)
    assert len(lines) == 1 and lines[0].startswith("partition 0 offset 2: leased to c2 at 2000 ms")
    assert "c1's lease" in lines[0] and "valid until 6000 ms" in lines[0]
    _only(h.verdict(), "group")


@pytest.mark.parametrize(("second_received_ms", "overlaps"), [(5_949, True), (5_950, False)])
def test_the_lease_overlap_allows_only_the_clock_slack(
    second_received_ms: int, overlaps: bool
) -> None:
    leases = [
        Lease("c1", 0, 0, received_ms=1_000, deadline_ms=6_000, settled_ms=None),
        Lease("c2", 0, 0, received_ms=second_received_ms, deadline_ms=9_000, settled_ms=None),
    ]
    reads, acks = [Read("m", 0, 0)], [AckResult(0, 0, "ACKED")]
    assert bool(find_group_violations(reads, leases, acks, lease_slack_ms=50)) == overlaps


def test_an_unknown_outcome_may_be_stored_or_not() -> None:
    sent = [
        Sent("p1-1", "p1", 1, "unknown"),
        Sent("p1-2", "p1", 2, "acked"),
        Sent("p1-3", "p1", 3, "unknown"),
    ]
    # p1-1 landed after p1-2 (its answer was lost, the retry went elsewhere); p1-3 never landed.
    reads = [Read("p1-2", 0, 0), Read("p1-1", 0, 1)]
    assert find_lost(sent, reads) == []
    assert find_reorders(sent, reads) == []
    verdict = check(sent, reads, [], [], [AckResult(0, 0, "ACKED"), AckResult(0, 1, "ACKED")])
    assert verdict.ok, verdict.summary()
    assert (verdict.acked, verdict.unknown, verdict.unknown_stored) == (1, 2, 1)
    # An unknown outcome is still bound by idempotence: stored twice is a duplicate.
    assert find_duplicates([*reads, Read("p1-1", 0, 2)]) == {"p1-1": [(0, 1), (0, 2)]}


def test_an_outcome_that_is_neither_acked_nor_unknown_is_refused() -> None:
    with pytest.raises(ValueError, match="'failed'"):
        find_lost([Sent("p1-1", "p1", 1, "failed")], [])


def test_the_summary_lists_at_most_twenty_items_of_a_kind() -> None:
    sent = [Sent(f"p1-{i:03}", "p1", i, "acked") for i in range(25)]
    summary = check(sent, [], [], [], []).summary()
    assert summary.startswith("VIOLATIONS: acked 25, unknown 0 (0 stored), read 0")
    assert "lost (acked, never read back) (25):" in summary
    assert "p1-019" in summary and "p1-020" not in summary
    assert "... and 5 more" in summary


def test_longest_outage_is_the_longest_gap_between_successes() -> None:
    assert longest_outage_ms([]) == 0
    attempts = [
        (0, 100, False),
        (50, 300, True),  # 300 ms from the first start to the first success
        (310, 400, True),
        (400, 900, False),
        (420, 1_500, True),  # 1100 ms between successes: the longest
        (1_510, 1_600, True),
    ]
    assert longest_outage_ms(attempts) == 1_100
    assert longest_outage_ms(attempts[:1]) == 100  # nothing ever succeeded
    assert longest_outage_ms([*attempts, (1_600, 3_000, False)]) == 1_400  # lasted to the end
    slow_start = [(0, 100, False), (50, 2_000, True), (2_010, 2_100, True)]
    assert longest_outage_ms(slow_start) == 2_000  # from the first start to the first success


def test_the_docstring_examples_hold() -> None:
    result = doctest.testmod(checker)
    assert result.attempted > 0
    assert result.failed == 0
