"""The safety checker of the simulation tier on hand-built histories: each property it checks
is shown failing on a history that breaks it (and holding on one that does not), so a green
simulation run means the properties held, not that the checker looked away."""

from __future__ import annotations

import pysyncobj.pickle
import pytest

from tests.sim.checker import SafetyChecker, SafetyViolation, frame_of


def _checker() -> SafetyChecker:
    c = SafetyChecker(seed=42, members=3)
    c.step = 17
    return c


def test_a_violation_names_the_seed_the_step_and_how_to_replay() -> None:
    c = _checker()
    c.on_leader(3, "a")
    with pytest.raises(SafetyViolation) as caught:
        c.on_leader(3, "b")
    text = str(caught.value)
    assert "seed 42, step 17" in text and "replay: pytest tests/sim --seed 42" in text


def test_two_leaders_in_one_term_break_election_safety() -> None:
    c = _checker()
    assert c.on_leader(3, "a") is True
    assert c.on_leader(3, "a") is False  # the same leader seen again
    assert c.on_leader(4, "b") is True
    with pytest.raises(SafetyViolation, match="one leader per term"):
        c.on_leader(4, "c")


def test_one_entry_with_two_commands_breaks_log_matching() -> None:
    c = _checker()
    c.on_append("a", (b"x", 5, 2), (b"p", 4, 1))
    c.on_append("b", (b"x", 5, 2), (b"p", 4, 1))  # the same entry elsewhere: fine
    with pytest.raises(SafetyViolation, match="log matching"):
        c.on_append("c", (b"y", 5, 2), (b"p", 4, 1))


def test_one_entry_after_two_different_prefixes_breaks_log_matching() -> None:
    c = _checker()
    c.on_append("a", (b"x", 5, 2), (b"p", 4, 1))
    c.on_append("b", (b"x", 5, 2), None)  # first entry of a log restored from a snapshot
    with pytest.raises(SafetyViolation, match="log matching"):
        c.on_append("c", (b"x", 5, 2), (b"q", 4, 2))


def test_an_index_committed_twice_with_different_entries_is_a_lost_commit() -> None:
    c = _checker()
    c.on_commit("a", (b"x", 5, 2), [])
    c.on_commit("b", (b"x", 5, 2), [])
    with pytest.raises(SafetyViolation, match="committed entries never change"):
        c.on_commit("c", (b"y", 5, 3), [])


def test_a_commit_not_durable_on_a_majority_is_caught() -> None:
    c = _checker()
    entry = (b"x", 5, 2)
    held = [(b"p", 4, 1), entry]
    c.check_majority_durable("a", entry, {"a": held, "b": [(b"p", 4, 1)], "c": held})
    compacted = [(b"s", 9, 2), (b"t", 10, 2)]  # a snapshot covers index 5
    c.check_majority_durable("a", entry, {"a": held, "b": compacted, "c": []})
    other_term = [(b"p", 4, 1), (b"z", 5, 1)]
    with pytest.raises(SafetyViolation, match="durable on a majority"):
        c.check_majority_durable("a", entry, {"a": held, "b": other_term, "c": []})
    with pytest.raises(SafetyViolation, match="stay durable on a majority"):
        c.check_still_durable("b", entry, {"a": held, "b": [], "c": other_term})


def test_a_leader_without_a_committed_entry_breaks_leader_completeness() -> None:
    c = _checker()
    c.on_commit("a", (b"x", 2, 1), [])
    c.on_new_leader("b", 2, [(b"n", 1, 0), (b"x", 2, 1), (b"y", 3, 2)])  # has it
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.on_new_leader("c", 3, [(b"n", 1, 0), (b"w", 2, 2)])
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.on_new_leader("c", 3, [(b"n", 1, 0)])  # a log that ends before it


def test_an_entry_committed_after_a_later_leader_was_seen_is_checked_against_it() -> None:
    c = _checker()
    leader_log = [(b"n", 1, 0), (b"w", 2, 3)]
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.on_commit("a", (b"x", 2, 1), [("b", 3, leader_log)])


def test_a_leader_of_a_term_before_the_commit_may_lack_an_entry_of_an_older_term() -> None:
    # Seen over the datagram network: a leader of term 4, cut off and still in office, holds
    # another entry at index 2 than the one (of term 3) that the leader of term 6 committed
    # with its own entries. Raft asks it of leaders after term 6 only.
    c = _checker()
    stale_leader_log = [(b"n", 1, 0), (b"w", 2, 2), (b"v", 3, 4)]
    c.on_commit("a", (b"x", 2, 3), [("b", 4, stale_leader_log)], committed_by=6)
    with pytest.raises(SafetyViolation, match="leader completeness"):
        c.on_new_leader("c", 7, stale_leader_log)


def test_an_acknowledged_command_not_committed_at_its_index_is_caught() -> None:
    c = _checker()
    entry_command = b"\x00" + pysyncobj.pickle.dumps((0, (b"cmd-1",)))
    assert frame_of(entry_command) == b"cmd-1" and frame_of(b"\x01") is None
    c.on_commit("a", (entry_command, 7, 2), [])
    c.on_ack("a", b"cmd-1", 7)
    with pytest.raises(SafetyViolation, match="acknowledged means committed"):
        c.on_ack("a", b"cmd-2", 7)
    with pytest.raises(SafetyViolation, match="acknowledged means committed"):
        c.on_ack("a", b"cmd-3", 8)


def test_state_machines_apply_in_order_and_agree_at_each_index() -> None:
    c = _checker()
    c.on_apply("a", 3, b"x", b"d3")
    c.on_apply("b", 3, b"x", b"d3")
    with pytest.raises(SafetyViolation, match="apply in log order"):
        c.on_apply("a", 3, b"x", b"d3")
    with pytest.raises(SafetyViolation, match="state machine safety"):
        c.on_apply("c", 3, b"y", b"d3")
    with pytest.raises(SafetyViolation, match="state machine safety"):
        c.on_apply("d", 3, b"x", b"other digest")
    c.on_restart("a")
    c.on_apply("a", 3, b"x", b"d3")  # a restarted replica applies again from the start


def test_a_replica_that_skipped_an_index_is_caught() -> None:
    c = _checker()
    c.on_apply("a", 3, b"x", b"d3")
    c.on_apply("a", 5, b"y", b"d5")
    c.check_applied_history("a", [(3, b"x"), (5, b"y")])
    with pytest.raises(SafetyViolation, match="every replica applies every committed"):
        c.check_applied_history("b", [(5, b"y")])


def test_a_restored_snapshot_must_hold_the_state_every_replica_had() -> None:
    c = _checker()
    c.on_apply("a", 3, b"x", b"d3")
    c.on_snapshot_installed("b", 4, (3, b"x"), b"d3")
    with pytest.raises(SafetyViolation, match="state machine safety"):
        c.on_snapshot_installed("c", 4, (3, b"x"), b"wrong")
