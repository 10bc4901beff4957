"""JournalCore: a Raft log behind pysyncobj's ``Journal`` interface, minus its disk.

The log lives in memory (pysyncobj indexes it like a list); every change is also queued as an
operation, and a flush replays the queued operations, in order, onto the disk in one write
(``_write``, the only thing a storage supplies: ``LmdbJournal`` writes one LMDB transaction and
fsyncs it, ``MemoryJournal`` a second copy that a simulated crash keeps). Both journals share
every rule of this module, so the simulation tier checks the same bookkeeping the nodes run.

Durability rules:
- term and vote are durable before any vote or request reflecting them can leave;
- the log up to the commit index is durable before the commit index moves (pysyncobj applies
  right after); the index itself is volatile in Raft and rides with a later flush;
- a leader's flush may run on another thread (``flush_async``) while the driver goes on; at most
  one is in flight, and it completes on the journal's own thread (``poll_flushed`` or any
  synchronous flush), so ``durable_index`` and the observers move there only;
- before the log is truncated, the flush in flight completes: its durable index must not be
  taken for entries written later at the same indexes.
"""

from __future__ import annotations

import abc
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

Item = tuple[bytes, int, int]  # (command, index, term): pysyncobj's entry shape
Meta = tuple[int, str | None, int]  # (term, voted for, commit index)


class JournalError(Exception):
    pass


@dataclass(slots=True)
class FlushJob:
    """Changes taken for one write: ops in order ("put", item) | ("del_from", index) |
    ("del_to", index), the meta record (None: left alone), the last log index they leave on
    disk, and (once written) how long the write took."""

    ops: list[tuple[str, Any]]
    meta: Meta | None
    last_index: int
    seconds: float = 0.0


class JournalCore(abc.ABC):
    def __init__(self, entries: list[Item], meta: Meta) -> None:
        self._entries = entries
        self._term, self._voted_for, self._commit_index = meta
        self._ops: list[tuple[str, Any]] = []
        self._meta_dirty = False  # term or vote changed: durable before anything leaves
        self._commit_dirty = False  # the commit index moved: written with the next flush
        self._inflight: tuple[FlushJob, concurrent.futures.Future[float]] | None = None
        self._view_end: int | None = None  # see hide_after()
        self.before_trim: Callable[[], None] | None = None
        # (commit index so far, the one proposed) -> on a leader, the one to take; None
        # elsewhere: see setRaftCommitIndex.
        self.commit_bound: Callable[[int, int], int | None] | None = None
        self.fsyncs = 0
        self.durable_index = entries[-1][1] if entries else 0  # last index known on disk
        # Observers: flush durations in seconds (metrics); and for the latency budget
        # (raft/stages.py) an entry appended, the durable index after a flush, the log
        # truncated from an index on, the commit index moved. Called on the journal's thread.
        self.on_flush: Callable[[float], None] | None = None
        self.on_append: Callable[[int], None] | None = None
        self.on_durable: Callable[[int], None] | None = None
        self.on_truncate: Callable[[int], None] | None = None
        self.on_commit: Callable[[int], None] | None = None

    # -- what a storage supplies --------------------------------------------------------------

    @abc.abstractmethod
    def _write(self, job: FlushJob) -> float:
        """Put ``job`` on disk, durably, in one write (any thread; one at a time). ->
        seconds."""

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
        self._finish_inflight()  # its durable index must not be taken for later entries
        self._entries = []
        self._ops.append(("del_from", 0))
        self.durable_index = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        assert self._view_end is None
        if entryFrom >= len(self._entries):
            return
        self._finish_inflight()  # its durable index must not be taken for later entries
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
            # The snapshot that replaces this prefix must be durable before the prefix goes.
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

    def close(self) -> None:
        self.flush()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Called just before apply. The commit index itself need not be durable (Raft keeps it
        # volatile); it rides with a later flush. A leader's is bounded by what a majority holds
        # durably, itself counted only up to its durable index (``commit_bound``): its own fsync
        # stays off the path. Anyone else's log up to the commit index is made durable first.
        bounded = None
        if self.commit_bound is not None:
            bounded = self.commit_bound(self._commit_index, raftCommitIndex)
        if bounded is not None:
            raftCommitIndex = bounded
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._commit_dirty = True
        if bounded is None:
            self.flush_upto(raftCommitIndex)
        if self.on_commit is not None:
            self.on_commit(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        # Never past the end of the log (RAFT.md problem 2: 3073 stored vs a log ending at 2944).
        last = self._entries[-1][1] if self._entries else 1
        return max(1, min(self._commit_index, last))

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        self._term = term
        self._voted_for = votedForNodeId
        self._meta_dirty = True
        self.flush()  # before any vote or request reflecting it can leave

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
        """Make every pending change durable: one write (after the flush in flight, if any,
        finished)."""
        self._finish_inflight()
        if not self._ops and not self._meta_dirty:
            return
        job = self._take_job()
        self._write(job)
        self._flushed(job)

    def flush_upto(self, index: int) -> None:
        """Make the log durable at least up to ``index``: waits for the flush in flight, and
        flushes the rest only if that one did not cover ``index``."""
        if self.durable_index >= index and not self._meta_dirty:
            return  # durable already: a flush in flight covers later entries only
        self._finish_inflight()
        if self.durable_index < index or self._meta_dirty:
            self.flush()

    def flush_async(self, writer: concurrent.futures.Executor, wake: Callable[[], None]) -> None:
        """Start making the pending changes durable on ``writer`` (one thread) and return;
        ``wake`` is called (on the writer) when the write is done."""
        if self._inflight is not None or not self._ops:
            return
        job = self._take_job()
        future = writer.submit(self._write, job)
        self._inflight = (job, future)
        future.add_done_callback(lambda _done: wake())

    def poll_flushed(self) -> bool:
        """Complete the flush in flight if it finished. -> whether one is still in flight."""
        if self._inflight is not None and self._inflight[1].done():
            self._finish_inflight()
        return self._inflight is not None

    @property
    def flush_inflight(self) -> bool:
        return self._inflight is not None

    @property
    def flush_finished(self) -> bool:
        """The flush in flight is done and waits for ``poll_flushed`` to complete it."""
        return self._inflight is not None and self._inflight[1].done()

    def _finish_inflight(self) -> None:
        if self._inflight is None:
            return
        job, future = self._inflight
        self._inflight = None
        future.result()  # a failed write raises here, on the journal's own thread
        self._flushed(job)

    def _take_job(self) -> FlushJob:
        ops, self._ops = self._ops, []
        meta: Meta | None = None
        # Most flushes only append entries: leave the meta record be. A moved commit index alone
        # never costs a flush of its own (a stale one read at restart is only lower, and the
        # leader tells the rest): it rides with this one.
        if self._meta_dirty or self._commit_dirty:
            meta = (self._term, self._voted_for, self._commit_index)
        self._meta_dirty = False
        self._commit_dirty = False
        return FlushJob(ops, meta, self._entries[-1][1] if self._entries else 0)

    def _flushed(self, job: FlushJob) -> None:
        self.fsyncs += 1
        if self.on_flush is not None:
            self.on_flush(job.seconds)
        # Entries truncated since the job was taken are not durable for being in it.
        self.durable_index = min(job.last_index, self._entries[-1][1] if self._entries else 0)
        if self.on_durable is not None:
            self.on_durable(self.durable_index)

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
