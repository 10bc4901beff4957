"""MemoryJournal: the in-memory twin of ``LmdbJournal``, for the simulation tier (tests/sim).

Same interface and the same durability rule: changes are pending until ``flush()``, and
``crash()`` returns the journal a restarted node would load, holding exactly what was flushed
(what ``LmdbJournal`` reloads after a kill -9 between two flushes). The durable copy is kept
apart from the live log and is changed only by replaying the pending operations in order, as
``LmdbJournal.flush`` replays them into one write transaction, so the two cannot drift apart
by construction of a shortcut (such as copying the live log at flush time).

tests/raft/test_journal_contract.py runs one behaviour suite against both journals.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from raft.journal import Item, JournalError


@dataclass(slots=True)
class _FlushJob:
    """As LmdbJournal's: ops in order, the meta record (None: left alone), the last index."""

    ops: list[tuple[str, Any]]
    meta: tuple[int, str | None, int] | None
    last_index: int


@dataclass
class DurableJournalState:
    """What a journal holds on disk: survives ``crash()``."""

    entries: list[Item] = field(default_factory=list)
    term: int = 0
    voted_for: str | None = None
    commit_index: int = 1

    def copy(self) -> DurableJournalState:
        return DurableJournalState(list(self.entries), self.term, self.voted_for, self.commit_index)


def _position(entries: list[Item], index: int) -> int:
    """Where log ``index`` is (or would be) in the contiguous ``entries``."""
    if not entries:
        return 0
    return max(0, min(len(entries), index - entries[0][1]))


class MemoryJournal:
    """A Raft log in memory whose "disk" is a second copy updated only by ``flush()``."""

    def __init__(self, durable: DurableJournalState | None = None) -> None:
        self._disk = durable.copy() if durable is not None else DurableJournalState()
        self._entries: list[Item] = list(self._disk.entries)
        self._term = self._disk.term
        self._voted_for = self._disk.voted_for
        self._commit_index = self._disk.commit_index
        # Pending changes, in order: ("put", item) | ("del_from", index) | ("del_to", index)
        self._ops: list[tuple[str, Any]] = []
        self._meta_dirty = False  # term or vote changed: durable before anything leaves
        self._commit_dirty = False  # the commit index moved: written with the next flush
        self._inflight: tuple[_FlushJob, concurrent.futures.Future[None]] | None = None
        self._view_end: int | None = None  # see hide_after()
        self._closed = False
        self.before_trim: Callable[[], None] | None = None
        self.fsyncs = 0
        self.on_flush: Callable[[float], None] | None = None
        self.durable_index = self._entries[-1][1] if self._entries else 0
        self.on_append: Callable[[int], None] | None = None
        self.on_durable: Callable[[int], None] | None = None
        self.on_truncate: Callable[[int], None] | None = None
        self.on_commit: Callable[[int], None] | None = None

    # -- pysyncobj's Journal interface --------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        assert self._view_end is None, "the journal is read-only while a suffix is hidden"
        if self._entries:
            assert idx == self._entries[-1][1] + 1, (idx, self._entries[-1][1])
        item = (bytes(command), idx, term)
        self._entries.append(item)
        self._ops.append(("put", item))
        if self.on_append is not None:
            self.on_append(idx)

    def clear(self) -> None:
        assert self._view_end is None
        self._finish_inflight()
        self._entries = []
        self._ops.append(("del_from", 0))
        self.durable_index = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        assert self._view_end is None
        if entryFrom >= len(self._entries):
            return
        self._finish_inflight()
        first_gone = self._entries[entryFrom][1]
        del self._entries[entryFrom:]
        self._ops.append(("del_from", first_gone))
        self.durable_index = min(self.durable_index, first_gone - 1)
        if self.on_truncate is not None:
            self.on_truncate(first_gone)

    def deleteEntriesTo(self, entryTo: int) -> None:
        assert self._view_end is None
        if entryTo <= 0 or not self._entries:
            return
        keep_from = (
            self._entries[entryTo][1] if entryTo < len(self._entries) else self._entries[-1][1] + 1
        )
        if self.before_trim is not None:
            self.before_trim()
        del self._entries[:entryTo]
        self._ops.append(("del_to", keep_from))
        self.flush()

    @overload
    def __getitem__(self, item: int) -> Item: ...

    @overload
    def __getitem__(self, item: slice) -> list[Item]: ...

    def __getitem__(self, item: int | slice) -> Item | list[Item]:
        if self._view_end is None:
            return self._entries[item]
        n = self._view_end
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            return self._entries[start:stop:step]
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries) if self._view_end is None else self._view_end

    def _destroy(self) -> None:
        self.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # As LmdbJournal: the log up to the commit index is durable before anything is applied;
        # the index itself rides with a later flush.
        self._commit_index = raftCommitIndex
        self._commit_dirty = True
        self.flush_upto(raftCommitIndex)
        if self.on_commit is not None:
            self.on_commit(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        last = self._entries[-1][1] if self._entries else 1
        return max(1, min(self._commit_index, last))

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        self._term = term
        self._voted_for = votedForNodeId
        self._meta_dirty = True
        self.flush()

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        self.flush()

    # -- durability ---------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return bool(self._ops) or self._meta_dirty

    def flush(self) -> None:
        """Make every pending change durable (after the flush in flight, if any)."""
        self._finish_inflight()
        if not self._ops and not self._meta_dirty:
            return
        assert not self._closed, "flush after close"
        job = self._take_job()
        self._write(job)
        self._flushed(job)

    def flush_upto(self, index: int) -> None:
        """Make the log durable at least up to ``index`` (as LmdbJournal.flush_upto)."""
        self._finish_inflight()
        if self.durable_index < index or self._meta_dirty:
            self.flush()

    def flush_async(self, writer: concurrent.futures.Executor, wake: Callable[[], None]) -> None:
        """Start the write of the pending changes on ``writer``; ``poll_flushed`` or any
        synchronous flush completes it (as LmdbJournal.flush_async). A crash before the write
        ran loses it."""
        if self._inflight is not None or not self._ops:
            return
        job = self._take_job()
        future = writer.submit(self._write, job)
        self._inflight = (job, future)
        future.add_done_callback(lambda _done: wake())

    def poll_flushed(self) -> bool:
        if self._inflight is not None and self._inflight[1].done():
            self._finish_inflight()
        return self._inflight is not None

    @property
    def flush_inflight(self) -> bool:
        return self._inflight is not None

    def _finish_inflight(self) -> None:
        if self._inflight is None:
            return
        job, future = self._inflight
        self._inflight = None
        future.result()
        self._flushed(job)

    def _take_job(self) -> _FlushJob:
        ops, self._ops = self._ops, []
        meta = None
        if self._meta_dirty or self._commit_dirty:
            meta = (self._term, self._voted_for, self._commit_index)
        self._meta_dirty = False
        self._commit_dirty = False
        return _FlushJob(ops, meta, self._entries[-1][1] if self._entries else 0)

    def _write(self, job: _FlushJob) -> None:
        """Replay ``job`` onto the durable copy, as LmdbJournal replays it into one write
        transaction."""
        disk = self._disk
        for kind, arg in job.ops:
            if kind == "put":
                disk.entries.append(arg)
            elif kind == "del_from":
                del disk.entries[_position(disk.entries, arg) :]
            elif kind == "del_to":
                del disk.entries[: _position(disk.entries, arg)]
            else:  # pragma: no cover - a bug
                raise AssertionError(kind)
        if job.meta is not None:
            disk.term, disk.voted_for, disk.commit_index = job.meta
        # Same invariant LmdbJournal asserts before committing.
        disk_last = disk.entries[-1][1] if disk.entries else 0
        assert disk_last == job.last_index, (disk_last, job.last_index)

    def _flushed(self, job: _FlushJob) -> None:
        self.fsyncs += 1
        if self.on_flush is not None:
            self.on_flush(0.0)
        self.durable_index = min(job.last_index, self._entries[-1][1] if self._entries else 0)
        if self.on_durable is not None:
            self.on_durable(self.durable_index)

    def crash(self) -> MemoryJournal:
        """The journal a node restarted after a crash loads: only what was flushed. ``self``
        is left as it was (the crashed process's memory); do not use both."""
        entries = self._disk.entries
        # As LmdbJournal asserts when it loads: the log on disk is contiguous.
        for before, after in itertools.pairwise(entries):
            if after[1] != before[1] + 1:
                raise JournalError(f"memory journal has a gap: {before[1]} then {after[1]}")
        return type(self)(self._disk)

    def durable_entries(self) -> Sequence[Item]:
        """The durable log (read-only view): what a crash would keep."""
        return self._disk.entries

    # -- the suffix view (used by the append-entries fix) -------------------------------------

    def hide_after(self, index: int | None) -> None:
        """Make the log look as if it ended at ``index`` (None: show everything). While hidden
        the journal refuses changes."""
        if index is None:
            self._view_end = None
            return
        first = self._entries[0][1] if self._entries else 1
        self._view_end = max(0, min(len(self._entries), index - first + 1))

    @property
    def last_index(self) -> int:
        return self._entries[-1][1] if self._entries else 0

    def close(self) -> None:
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
