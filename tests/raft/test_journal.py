"""LmdbJournal: what is flushed survives a restart, what is not flushed does not, and a flush
is one fsync however many changes it carries.

A crash is emulated without ``close()`` (which flushes): the journal directory is copied while
the journal is still open, so the copy holds exactly what LMDB committed to disk, and the copy is
opened as the restarted node's journal.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from raft.journal import JournalError, LmdbJournal

MAP = 64 << 20  # keep test environments small


def entries(j: LmdbJournal) -> list[tuple[bytes, int, int]]:
    return [j[i] for i in range(len(j))]


def crash_copy(src: Path, dst: Path) -> LmdbJournal:
    """The journal a node restarted after a crash would open: what is on disk right now."""
    shutil.copytree(src, dst)
    return LmdbJournal(str(dst), map_size_bytes=MAP)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[LmdbJournal]:
    j = LmdbJournal(str(tmp_path / "j"), map_size_bytes=MAP)
    yield j
    j.close()


def fill(j: LmdbJournal, first: int, last: int, term: int = 1) -> None:
    for i in range(first, last + 1):
        j.add(b"cmd-%d" % i, i, term)


def test_flushed_entries_term_vote_and_commit_index_survive_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    fill(j, 1, 9, term=2)
    j.setCurrentTerm(3, "127.0.0.1:1")
    j.setRaftCommitIndex(7)
    fill(j, 10, 10, term=2)
    j.flush()  # the commit index rides with the entry
    expected = entries(j)
    j.close()

    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert entries(k) == expected
        assert k[0] == (b"cmd-1", 1, 2) and k[-1] == (b"cmd-10", 10, 2)
        assert k.getCurrentTerm() == 3
        assert k.getVotedForNodeId() == "127.0.0.1:1"
        assert k.getRaftCommitIndex() == 7
        assert k.durable_index == 10 and k.last_index == 10
        assert not k.dirty
    finally:
        k.close()


def test_unflushed_entries_are_not_on_disk_after_a_crash(
    tmp_path: Path, journal: LmdbJournal
) -> None:
    fill(journal, 1, 5)
    journal.flush()
    fill(journal, 6, 9)  # added, never flushed
    assert journal.dirty and journal.durable_index == 5

    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert [e[1] for e in entries(restarted)] == [1, 2, 3, 4, 5]
        assert restarted.durable_index == 5
    finally:
        restarted.close()


def test_nothing_reaches_disk_before_the_first_flush(tmp_path: Path, journal: LmdbJournal) -> None:
    fill(journal, 1, 3)
    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert len(restarted) == 0 and restarted.durable_index == 0
        assert restarted.getCurrentTerm() == 0 and restarted.getVotedForNodeId() is None
    finally:
        restarted.close()


def test_set_current_term_is_durable_immediately(tmp_path: Path, journal: LmdbJournal) -> None:
    fill(journal, 1, 3)
    fsyncs = journal.fsyncs
    journal.setCurrentTerm(4, "127.0.0.1:9")  # no explicit flush
    assert journal.fsyncs == fsyncs + 1 and not journal.dirty

    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert restarted.getCurrentTerm() == 4
        assert restarted.getVotedForNodeId() == "127.0.0.1:9"
        # Pending entries travel in the same transaction as the term.
        assert [e[1] for e in entries(restarted)] == [1, 2, 3]
    finally:
        restarted.close()


def test_set_raft_commit_index_makes_the_log_durable_before_apply(
    tmp_path: Path, journal: LmdbJournal
) -> None:
    fill(journal, 1, 4)
    journal.setRaftCommitIndex(4)
    assert journal.durable_index == 4 and not journal.dirty
    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert [e[1] for e in entries(restarted)] == [1, 2, 3, 4]
        assert restarted.getRaftCommitIndex() == 4
    finally:
        restarted.close()


def test_a_moved_commit_index_alone_costs_no_fsync_and_rides_with_the_next_entries(
    tmp_path: Path, journal: LmdbJournal
) -> None:
    fill(journal, 1, 4)
    journal.setRaftCommitIndex(2)
    before = journal.fsyncs
    journal.setRaftCommitIndex(4)  # a follower learning the commit index from a heartbeat
    journal.flush()  # what a send does: nothing to make durable but the commit index
    assert journal.fsyncs == before, "a commit index alone is not worth an fsync"
    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert restarted.getRaftCommitIndex() == 2, "a stale commit index is only lower"
    finally:
        restarted.close()
    fill(journal, 5, 5)
    journal.flush()
    assert journal.fsyncs == before + 1
    again = crash_copy(tmp_path / "j", tmp_path / "crashed-again")
    try:
        assert again.getRaftCommitIndex() == 4
    finally:
        again.close()


def test_one_flush_of_many_adds_is_one_fsync_and_advances_durable_index(
    journal: LmdbJournal,
) -> None:
    fill(journal, 1, 1000)
    before = journal.fsyncs
    assert journal.durable_index == 0
    journal.flush()
    assert journal.fsyncs == before + 1
    assert journal.durable_index == 1000
    journal.flush()  # nothing pending: no transaction, no fsync
    assert journal.fsyncs == before + 1


def test_delete_entries_from_survives_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    fill(j, 1, 10)
    j.flush()
    j.deleteEntriesFrom(6)  # a position: entries 7..10 go
    assert j.durable_index == 6 and j.last_index == 6
    j.add(b"new-7", 7, 2)
    j.flush()
    j.close()
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert [(e[1], e[2]) for e in entries(k)] == [(i, 1) for i in range(1, 7)] + [(7, 2)]
        assert k[-1][0] == b"new-7"
    finally:
        k.close()


def test_delete_entries_from_unflushed_is_undone_by_a_crash(
    tmp_path: Path, journal: LmdbJournal
) -> None:
    fill(journal, 1, 10)
    journal.flush()
    journal.deleteEntriesFrom(3)
    restarted = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert restarted.last_index == 10  # the truncation was never made durable
    finally:
        restarted.close()


def test_delete_entries_to_is_durable_at_once_and_survives_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    trims: list[int] = []
    j.before_trim = lambda: trims.append(j.last_index)
    fill(j, 1, 10)
    j.deleteEntriesTo(4)  # a position: entries 1..4 go; flushes by itself
    assert trims == [10], "the snapshot hook runs before the prefix goes"
    assert not j.dirty and j.durable_index == 10
    assert [e[1] for e in entries(j)] == list(range(5, 11))
    crashed = crash_copy(tmp_path / "j", tmp_path / "crashed")
    try:
        assert [e[1] for e in entries(crashed)] == list(range(5, 11))
    finally:
        crashed.close()
    j.close()
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert [e[1] for e in entries(k)] == list(range(5, 11))
        k.add(b"cmd-11", 11, 1)
        k.flush()
        assert k.durable_index == 11
    finally:
        k.close()


def test_delete_entries_to_past_the_end_empties_the_log(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    fill(j, 1, 5)
    j.deleteEntriesTo(99)
    assert len(j) == 0
    j.close()
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert len(k) == 0
    finally:
        k.close()


def test_clear_then_add_survives_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    fill(j, 1, 10)
    j.flush()
    j.clear()
    assert len(j) == 0 and j.durable_index == 0
    j.add(b"snap-prev", 41, 3)
    j.add(b"snap-last", 42, 3)
    j.flush()
    assert j.durable_index == 42
    j.close()
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert entries(k) == [(b"snap-prev", 41, 3), (b"snap-last", 42, 3)]
    finally:
        k.close()


def test_commit_index_is_clamped_to_the_log_end(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    assert j.getRaftCommitIndex() == 1  # empty log: pysyncobj's initial value
    fill(j, 1, 5)
    j.setRaftCommitIndex(100)
    assert j.getRaftCommitIndex() == 5
    j.close()
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert k.getRaftCommitIndex() == 5, "a stored commit index past the log end is clamped"
        k.deleteEntriesFrom(2)  # log now ends at 2
        assert k.getRaftCommitIndex() == 2
    finally:
        k.close()


def _write_raw(path: str, indexes: list[int]) -> None:
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=MAP, subdir=True, max_dbs=2)
    db = env.open_db(b"entries")
    with env.begin(write=True) as txn:
        for i in indexes:
            txn.put(struct.pack(">Q", i), struct.pack(">Q", 1) + b"x", db=db)
    env.close()


def test_a_gap_in_the_stored_log_is_detected_on_load(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    _write_raw(path, [1, 2, 3, 5, 6])
    with pytest.raises(JournalError, match="gap: 3 then 5"):
        LmdbJournal(path, map_size_bytes=MAP)


def test_a_contiguous_raw_log_loads(tmp_path: Path) -> None:
    # Control for the gap test: the same raw layout without a gap is accepted.
    path = str(tmp_path / "j")
    _write_raw(path, [3, 4, 5])
    j = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert [e[1] for e in entries(j)] == [3, 4, 5] and j.durable_index == 5
    finally:
        j.close()


def test_hidden_suffix_is_out_of_sight_and_the_journal_refuses_changes(
    journal: LmdbJournal,
) -> None:
    fill(journal, 1, 10)
    journal.hide_after(6)
    assert len(journal) == 6 and journal[-1][1] == 6
    assert [e[1] for e in journal[0:100]] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(IndexError):
        journal[6]
    with pytest.raises(AssertionError):
        journal.add(b"x", 11, 1)
    journal.hide_after(None)
    assert len(journal) == 10


def test_close_flushes_pending_changes(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    j = LmdbJournal(path, map_size_bytes=MAP)
    fill(j, 1, 3)
    j.close()
    j.close()  # idempotent
    k = LmdbJournal(path, map_size_bytes=MAP)
    try:
        assert k.last_index == 3
    finally:
        k.close()
