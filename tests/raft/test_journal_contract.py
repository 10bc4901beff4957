"""One behaviour suite for every Raft journal: ``SegmentFileJournal`` (the one nodes run),
``LmdbJournal`` (what earlier versions ran; read to migrate) and ``MemoryJournal`` (the twin in
the simulation tier, tests/sim). The simulation's crash model is only as good as this suite:
whatever it proves about a crash must hold on disk too.

A crash of an on-disk journal is emulated without ``close()`` (which flushes): the directory is
copied while the journal is open, so the copy holds exactly what was written, and the copy is
opened as the restarted node's journal. A memory journal's ``crash()`` returns that journal."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from raft.journal import LmdbJournal
from raft.journal_memory import MemoryJournal
from raft.segment_journal import SegmentFileJournal

MAP_BYTES = 64 << 20

Journal = Any  # SegmentFileJournal | LmdbJournal | MemoryJournal: one interface (JournalCore)
SEGMENT_BYTES = 4096  # small: the suite crosses segment boundaries


class Kind:
    """How to open a journal of one implementation, and what a crash leaves of it."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self._ids = count()
        self.opened: list[Journal] = []

    def open(self) -> Journal:
        if self.name == "memory":
            j: Journal = MemoryJournal()
        elif self.name == "segment":
            j = SegmentFileJournal(
                str(self.root / f"j{next(self._ids)}"), segment_bytes=SEGMENT_BYTES
            )
        else:
            j = LmdbJournal(str(self.root / f"j{next(self._ids)}"), map_size_bytes=MAP_BYTES)
        self.opened.append(j)
        return j

    def crash(self, j: Journal) -> Journal:
        """The journal the node loads after being killed now (pending changes not flushed)."""
        if isinstance(j, MemoryJournal):
            after: Journal = j.crash()
        else:
            copy = self.root / f"j{next(self._ids)}"
            shutil.copytree(j._path, copy)
            if self.name == "segment":
                after = SegmentFileJournal(str(copy), segment_bytes=SEGMENT_BYTES)
            else:
                after = LmdbJournal(str(copy), map_size_bytes=MAP_BYTES)
        self.opened.append(after)
        return after

    def reopen(self, j: Journal) -> Journal:
        """The journal at ``j``'s directory, opened again (``j`` closed)."""
        if self.name == "segment":
            after: Journal = SegmentFileJournal(j._path, segment_bytes=SEGMENT_BYTES)
        else:
            after = LmdbJournal(j._path, map_size_bytes=MAP_BYTES)
        self.opened.append(after)
        return after

    def close_all(self) -> None:
        for j in self.opened:
            j.close()


@pytest.fixture(params=["segment", "lmdb", "memory"])
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kind]:
    k = Kind(request.param, tmp_path)
    yield k
    k.close_all()


def fill(j: Journal, first: int, last: int, term: int = 1) -> None:
    for i in range(first, last + 1):
        j.add(b"cmd-%d" % i, i, term)


def indexes(j: Journal) -> list[int]:
    return [item[1] for item in j[:]]


def test_flushed_entries_term_vote_and_commit_index_survive_a_crash(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 10, term=2)
    j.setCurrentTerm(3, "n1")
    j.setRaftCommitIndex(7)  # the log is durable past 7 already: no flush of its own
    fill(j, 11, 11, term=3)
    j.flush()  # the commit index rides with this one
    after = kind.crash(j)
    assert after[:] == j[:]
    assert after[0] == (b"cmd-1", 1, 2) and after[-1] == (b"cmd-11", 11, 3)
    assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (3, "n1")
    assert after.getRaftCommitIndex() == 7
    assert after.durable_index == 11


def test_entries_added_after_the_last_flush_are_lost_in_a_crash(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 5)
    j.flush()
    fill(j, 6, 9)
    assert j.durable_index == 5 and j.dirty
    after = kind.crash(j)
    assert indexes(after) == [1, 2, 3, 4, 5]


def test_a_truncation_not_flushed_is_undone_by_a_crash(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 6)
    j.flush()
    j.deleteEntriesFrom(3)  # positions: entries 4..6 go
    fill(j, 4, 4, term=2)
    assert indexes(j) == [1, 2, 3, 4] and j.durable_index == 3
    after = kind.crash(j)
    assert after[:] == [(b"cmd-%d" % i, i, 1) for i in range(1, 7)]


def test_a_flushed_truncation_and_rewrite_survive_a_crash(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 6)
    j.flush()
    j.deleteEntriesFrom(3)
    fill(j, 4, 5, term=2)
    j.flush()
    after = kind.crash(j)
    assert [(i, t) for _, i, t in after[:]] == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]


def test_a_term_and_vote_are_durable_as_soon_as_they_are_set(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 3)
    j.setCurrentTerm(4, "n2")  # flushes: a vote must be on disk before it is sent
    after = kind.crash(j)
    assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (4, "n2")
    assert indexes(after) == [1, 2, 3]  # the same flush carried the pending entries


def test_setting_the_commit_index_makes_the_log_durable_first(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 4)
    j.setRaftCommitIndex(4)
    assert not j.dirty
    after = kind.crash(j)
    assert indexes(after) == [1, 2, 3, 4] and after.getRaftCommitIndex() == 4


def test_a_commit_index_alone_never_costs_a_flush_and_rides_with_the_next(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 4)
    j.setRaftCommitIndex(2)  # entries pending: flushed, with the index
    fsyncs = j.fsyncs
    j.setRaftCommitIndex(4)  # the log is durable up to 4 already
    j.flush()  # nothing but the index is pending: no write
    assert j.fsyncs == fsyncs and not j.dirty
    assert kind.crash(j).getRaftCommitIndex() == 2  # only lower after a crash: Raft allows it
    fill(j, 5, 5)
    j.flush()
    assert kind.crash(j).getRaftCommitIndex() == 4


def test_flush_upto_writes_only_when_the_log_is_not_durable_that_far(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 5)
    j.flush()
    fill(j, 6, 8)
    fsyncs = j.fsyncs
    j.flush_upto(5)
    assert j.fsyncs == fsyncs and j.durable_index == 5
    j.flush_upto(7)
    assert j.fsyncs == fsyncs + 1 and j.durable_index == 8
    assert indexes(kind.crash(j)) == list(range(1, 9))


def test_an_asynchronous_flush_is_durable_once_written_and_completed_by_a_poll(
    kind: Kind,
) -> None:
    j = kind.open()
    fill(j, 1, 3)
    written = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as writer:
        j.flush_async(writer, written.set)
        assert written.wait(10.0)
        assert j.flush_inflight and j.durable_index == 0  # not completed on our thread yet
        assert indexes(kind.crash(j)) == [1, 2, 3]  # but on disk
        assert j.poll_flushed() is False
    assert not j.flush_inflight and j.durable_index == 3 and j.fsyncs >= 1


def test_the_observers_see_appends_truncations_commits_and_durability(kind: Kind) -> None:
    j = kind.open()
    seen: list[tuple[str, int]] = []
    j.on_append = lambda i: seen.append(("append", i))
    j.on_truncate = lambda i: seen.append(("truncate", i))
    j.on_commit = lambda i: seen.append(("commit", i))
    j.on_durable = lambda i: seen.append(("durable", i))
    fill(j, 1, 3)
    j.deleteEntriesFrom(2)  # positions: entry 3 goes
    j.setRaftCommitIndex(2)
    assert seen == [
        ("append", 1),
        ("append", 2),
        ("append", 3),
        ("truncate", 3),
        ("durable", 2),
        ("commit", 2),
    ]


def test_the_commit_index_read_after_a_crash_is_clamped_to_the_log_end(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 5)
    j.setRaftCommitIndex(50)
    fill(j, 6, 8)
    after = kind.crash(j)
    assert after.getRaftCommitIndex() == 5


def test_trimming_a_prefix_is_durable_at_once_and_runs_before_trim_first(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 10)
    j.flush()
    seen: list[list[int]] = []
    j.before_trim = lambda: seen.append(indexes(j))
    j.deleteEntriesTo(4)  # positions: entries 1..4 go
    assert seen == [list(range(1, 11))]  # the prefix was still there when asked
    assert not j.dirty
    after = kind.crash(j)
    assert indexes(after) == [5, 6, 7, 8, 9, 10]
    fill(after, 11, 11)
    after.flush()
    assert indexes(kind.crash(after)) == [5, 6, 7, 8, 9, 10, 11]


def test_clear_then_add_restarts_the_log_at_any_index(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 5)
    j.flush()
    j.clear()
    j.add(b"snap-prev", 41, 3)
    j.add(b"snap-last", 42, 3)
    assert kind.crash(j)[:] != j[:]  # not flushed: the old log is what a crash leaves
    j.flush()
    after = kind.crash(j)
    assert after[:] == [(b"snap-prev", 41, 3), (b"snap-last", 42, 3)]
    assert after.durable_index == 42


def test_one_flush_is_one_fsync_and_a_clean_journal_does_not_fsync(kind: Kind) -> None:
    j = kind.open()
    before = j.fsyncs
    durations: list[float] = []
    j.on_flush = durations.append
    fill(j, 1, 50)
    j.setRaftCommitIndex(3)  # flushes the 50 entries and the index together
    j.flush()
    j.flush()
    assert j.fsyncs - before == 1
    assert len(durations) == 1 and durations[0] >= 0.0


def test_hide_after_shows_a_prefix_and_refuses_changes_while_hidden(kind: Kind) -> None:
    j = kind.open()
    fill(j, 3, 9)  # a log that starts after a snapshot
    j.hide_after(5)
    assert len(j) == 3 and j[-1][1] == 5 and indexes(j) == [3, 4, 5]
    with pytest.raises(IndexError):
        j[3]
    with pytest.raises(AssertionError):
        j.add(b"x", 10, 1)
    j.hide_after(None)
    assert len(j) == 7 and j.last_index == 9


def test_adding_out_of_order_is_refused(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 3)
    with pytest.raises(AssertionError):
        j.add(b"x", 5, 1)


def test_close_flushes_what_is_pending(kind: Kind) -> None:
    j = kind.open()
    fill(j, 1, 3)
    j.close()
    after = j.crash() if isinstance(j, MemoryJournal) else kind.reopen(j)
    assert indexes(after) == [1, 2, 3]


def test_a_fresh_journal_is_empty_at_term_zero(kind: Kind) -> None:
    j = kind.open()
    assert len(j) == 0 and j.last_index == 0 and j.durable_index == 0
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)
