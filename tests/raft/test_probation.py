"""Hook 10's rule (raft/probation.py) and where raft/ keeps it on disk: a replica that starts
without Raft state is on probation until it holds what a leader committed, or a majority holds
nothing. The schedules that need it are in tests/sim/test_disk_loss.py and
tests/integration/test_disk_loss.py."""

from __future__ import annotations

import os

from raft.probation import PROBE_INTERVAL_S, Probation
from raft.pysyncobj_shard import PROBATION_FILE, enter_probation, leave_probation


def test_a_new_shard_leaves_probation_once_a_majority_holds_nothing() -> None:
    three = Probation(frozenset({"b", "c"}))
    three.on_probe_reply("b", True)
    assert three.whole
    five = Probation(frozenset({"b", "c", "d", "e"}))
    five.on_probe_reply("b", True)
    assert not five.whole  # two of five
    five.on_probe_reply("c", True)
    assert five.whole


def test_a_member_holding_an_entry_keeps_the_replica_on_probation_until_a_leader_refills_it() -> (
    None
):
    p = Probation(frozenset({"b", "c"}))
    p.on_probe_reply("a-stranger", True)  # not a member: ignored
    p.on_probe_reply("c", False)
    p.on_probe_reply("b", True)
    p.on_probe_reply("c", True)  # said it holds something before: that stands
    assert not p.whole and p.has_history()
    assert p.probe_due(now_s=100.0) == frozenset()  # only a leader can end it now
    p.on_leader_append(leader_commit=40, our_commit=40, our_term_at_commit=6, leader_term=6)
    assert not p.whole  # not on disk yet
    p.on_durable(39)
    assert not p.whole
    p.on_durable(40)
    assert p.whole and "index 40" in p.reason


def test_a_new_leaders_older_commit_index_does_not_end_probation() -> None:
    # Until a leader commits an entry of its own term, its commit index may lag behind entries
    # committed in earlier terms: holding it proves nothing.
    p = Probation(frozenset({"b", "c"}))
    p.on_probe_reply("b", False)
    p.on_leader_append(leader_commit=30, our_commit=30, our_term_at_commit=4, leader_term=5)
    p.on_durable(30)
    assert not p.whole
    # Nor does a commit index our log does not reach yet.
    p.on_leader_append(leader_commit=31, our_commit=30, our_term_at_commit=None, leader_term=5)
    p.on_durable(31)
    assert not p.whole


def test_probes_go_to_the_members_not_heard_from_at_the_probe_interval() -> None:
    p = Probation(frozenset({"b", "c", "d", "e"}))
    assert p.probe_due(10.0) == {"b", "c", "d", "e"}
    assert p.probe_due(10.0 + PROBE_INTERVAL_S / 2) == frozenset()
    p.on_probe_reply("b", True)
    assert p.probe_due(10.0 + PROBE_INTERVAL_S) == {"c", "d", "e"}
    assert p.waiting_for() == ["c", "d", "e"]


def test_a_replica_without_raft_state_starts_on_probation_and_stays_there_across_restarts(
    tmp_path: object,
) -> None:
    root = str(tmp_path)
    assert enter_probation(root)  # nothing here: a new replica, or a lost disk
    assert os.path.exists(os.path.join(root, PROBATION_FILE))
    os.makedirs(os.path.join(root, "wal"))  # its journal, partly refilled
    assert enter_probation(root)  # restarted before it was whole: still on probation
    leave_probation(root)
    assert not os.path.exists(os.path.join(root, PROBATION_FILE))
    assert not enter_probation(root)  # a replica with its Raft state votes at once
    leave_probation(root)  # idempotent


def test_a_replica_with_an_older_journal_is_not_put_on_probation(tmp_path: object) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "journal"))  # an LMDB journal from before segment files
    assert not enter_probation(root)
    assert not os.path.exists(os.path.join(root, PROBATION_FILE))
