"""The replica-shape rule's decision (fluxmq.audit.shape), without Spark."""

from __future__ import annotations

import doctest

from fluxmq.audit import shape
from fluxmq.audit.shape import LogShape, shape_violations


def log(node: str, low: int, high: int, applied: int | None, **kw: object) -> LogShape:
    return LogShape(node, "s1", "q", 3, 0, low, high, applied, **kw)  # type: ignore[arg-type]


def found(rows: list[LogShape]) -> list[tuple[str, int | None]]:
    return [(v.node, v.offset) for v in shape_violations(rows)]


def test_the_worked_example_holds() -> None:
    assert doctest.testmod(shape).failed == 0


def test_replicas_at_one_applied_index_with_one_shape_are_clean() -> None:
    assert found([log("a", 5, 9, 7), log("b", 5, 9, 7), log("c", 5, 9, 7)]) == []


def test_a_replica_ahead_may_hold_more_and_have_removed_more() -> None:
    assert found([log("a", 0, 9, 7), log("b", 2, 12, 8)]) == []


def test_a_replica_behind_that_holds_more_than_one_ahead_is_named() -> None:
    (v,) = shape_violations([log("a", 0, 12, 7), log("b", 0, 9, 8)])
    assert (v.node, v.offset) == ("a", 9)
    assert "holds offsets [9, 12) at applied index 7, which b, applied further (to 8)" in v.detail


def test_a_replica_behind_that_removed_more_than_one_ahead_is_named() -> None:
    (v,) = shape_violations([log("a", 4, 9, 7), log("b", 1, 9, 8)])
    assert (v.node, v.offset) == ("a", None)
    assert "lacks offsets [1, 4)" in v.detail and "still holds" in v.detail


def other_log(node: str) -> LogShape:
    """A log of another queue every replica holds alike (what tells a store's applied index)."""
    return LogShape(node, "s1", "x", 9, 0, 0, 1, 7)


def test_a_log_missing_on_one_replica_at_the_same_index_is_named() -> None:
    rows = [log("a", 0, 4, 7), log("b", 0, 4, 7), *map(other_log, "abc")]
    (v,) = shape_violations(rows)
    assert (v.node, v.offset) == ("c", None)
    assert "holds no log for this partition where a,b" in v.detail


def test_a_log_only_one_replica_has_at_the_same_index_is_named_from_its_first_offset() -> None:
    rows = [log("a", 2, 4, 7), *map(other_log, "abc")]
    assert found(rows) == [("a", 2)]


def test_a_tie_takes_the_replica_with_fewer_records_as_right() -> None:
    assert found([log("a", 0, 10, 7), log("b", 0, 6, 7)]) == [("a", 6)]


def test_stores_without_an_applied_index_or_with_damaged_metadata_are_not_compared() -> None:
    assert found([log("a", 0, 10, None), log("b", 0, 6, None)]) == []
    assert found([log("a", 0, 0, 7, damaged=True), log("b", 0, 6, 7), log("c", 0, 6, 7)]) == []


def test_a_single_replica_is_compared_with_nothing() -> None:
    assert found([log("a", 0, 10, 7)]) == []
