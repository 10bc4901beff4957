"""LmdbJournal: a durable Raft log behind pysyncobj's ``Journal`` interface.

pysyncobj's own FileJournal is an mmap that is never fsync'd while running, and its term/vote
file is not fsync'd either (shared/notes/RAFT.md). This journal keeps the log in memory (pysyncobj
indexes it like a list) and mirrors every change into LMDB. Changes are buffered and made durable
by ``flush()``: one write transaction and one fsync for everything pending, however many entries.
The transport calls ``flush()`` before any message that promises what this node holds leaves it
(acknowledgements, votes: see ``raft/wire_transport.py``) and the journal flushes before the commit
index moves, so no node ever acknowledges, votes for or applies what is not on its disk.

Keys are log indexes (u64 big endian, so LMDB's order is log order); values are the term (u64)
followed by the command bytes. Term, vote and commit index live in a second database.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import lmdb

_U64 = struct.Struct(">Q")
_META_KEY = b"meta"

Item = tuple[bytes, int, int]  # (command, index, term): pysyncobj's entry shape


class JournalError(Exception):
    pass


@dataclass(slots=True)
class _FlushJob:
    """Changes taken for one write transaction: ops in order, the meta record (None: left
    alone), and the last log index they leave on disk."""

    ops: list[tuple[str, Any]]
    meta: dict[str, Any] | None
    last_index: int
    seconds: float = 0.0


class LmdbJournal:
    """The Raft log of one shard in its own LMDB environment at ``path`` (a directory)."""

    def __init__(self, path: str, *, map_size_bytes: int = 8 << 30) -> None:
        self._env: Any
        try:
            os.makedirs(path, exist_ok=True)
            self._env = lmdb.open(
                path,
                map_size=map_size_bytes,
                subdir=True,
                max_dbs=2,
                sync=True,
                metasync=True,
                readahead=False,
            )
        except (OSError, lmdb.Error) as e:
            raise JournalError(f"cannot open the raft journal at {path!r}: {e}") from e
        self._path = path
        self._entries_db = self._env.open_db(b"entries")
        self._meta_db = self._env.open_db(b"meta")
        self._entries: list[Item] = []
        self._term = 0
        self._voted_for: str | None = None
        self._commit_index = 1
        # Pending changes, in order: ("put", item) | ("del_from", index) | ("del_to", index)
        self._ops: list[tuple[str, Any]] = []
        self._meta_dirty = False  # term or vote changed: durable before anything leaves
        self._commit_dirty = False  # the commit index moved: written with the next flush
        self._inflight: tuple[_FlushJob, concurrent.futures.Future[float]] | None = None
        self._view_end: int | None = None  # see hide_after()
        self.before_trim: Callable[[], None] | None = None
        self.fsyncs = 0
        # Observer of flush durations in seconds (one transaction + fsync each): metrics.
        self.on_flush: Callable[[float], None] | None = None
        self.durable_index = 0  # last log index known to be on disk
        # Observers for the latency budget (raft/stages.py), set by the shard: an entry
        # appended, the durable index after a flush, the log truncated from an index on, the
        # commit index moved. Called on the driver thread.
        self.on_append: Callable[[int], None] | None = None
        self.on_durable: Callable[[int], None] | None = None
        self.on_truncate: Callable[[int], None] | None = None
        self.on_commit: Callable[[int], None] | None = None
        self._load()

    # -- loading ----------------------------------------------------------------------------

    def _load(self) -> None:
        with self._env.begin() as txn:
            raw = txn.get(_META_KEY, db=self._meta_db)
            if raw is not None:
                meta = json.loads(raw)
                self._term = int(meta["term"])
                self._voted_for = meta["voted_for"]
                self._commit_index = int(meta["commit_index"])
            previous = None
            for key, value in txn.cursor(db=self._entries_db):
                index = _U64.unpack(key)[0]
                term = _U64.unpack_from(value)[0]
                # Assert right after reading: the log on disk is contiguous.
                if previous is not None and index != previous + 1:
                    raise JournalError(
                        f"raft journal at {self._path!r} has a gap: {previous} then {index}"
                    )
                previous = index
                self._entries.append((bytes(value[8:]), index, term))
        self.durable_index = self._entries[-1][1] if self._entries else 0

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

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Called just before apply: the log up to the commit index must be durable first. The
        # commit index itself need not be (Raft keeps it volatile); it rides with a later flush.
        self._commit_index = raftCommitIndex
        self._commit_dirty = True
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
        """Make every pending change durable: one transaction, one fsync (after the flush in
        flight, if any, finished)."""
        self._finish_inflight()
        if not self._ops and not self._meta_dirty:
            return
        job = self._take_job()
        self._write(job)
        self._flushed(job)

    def flush_upto(self, index: int) -> None:
        """Make the log durable at least up to ``index``: waits for the flush in flight, and
        flushes the rest only if that one did not cover ``index``."""
        self._finish_inflight()
        if self.durable_index < index or self._meta_dirty:
            self.flush()

    def flush_async(self, writer: concurrent.futures.Executor, wake: Callable[[], None]) -> None:
        """Start making the pending changes durable on ``writer`` (one thread) and return;
        ``wake`` is called (on the writer) when the write is done. At most one flush is in
        flight; ``poll_flushed`` (or any synchronous flush) completes it on the caller's thread,
        so ``durable_index`` and the observers move there only."""
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

    def _finish_inflight(self) -> None:
        if self._inflight is None:
            return
        job, future = self._inflight
        self._inflight = None
        future.result()  # a failed write raises here, on the journal's own thread
        self._flushed(job)

    def _take_job(self) -> _FlushJob:
        ops, self._ops = self._ops, []
        meta = None
        # Most flushes only append entries: leave the meta page be. A moved commit index alone
        # never costs a flush of its own (Raft keeps it volatile; a stale one read at restart is
        # only lower, and the leader tells the rest): it rides with this one.
        if self._meta_dirty or self._commit_dirty:
            meta = {
                "term": self._term,
                "voted_for": self._voted_for,
                "commit_index": self._commit_index,
            }
        self._meta_dirty = False
        self._commit_dirty = False
        return _FlushJob(ops, meta, self._entries[-1][1] if self._entries else 0)

    def _write(self, job: _FlushJob) -> float:
        """One write transaction and its fsync (any thread; one at a time). -> seconds."""
        started = time.perf_counter()
        with self._env.begin(write=True) as txn:
            cur = txn.cursor(db=self._entries_db)
            for kind, arg in job.ops:
                if kind == "put":
                    command, index, term = arg
                    txn.put(_U64.pack(index), _U64.pack(term) + command, db=self._entries_db)
                elif kind == "del_from":
                    if cur.set_range(_U64.pack(arg)):
                        while cur.delete():
                            pass
                elif kind == "del_to":
                    if cur.first():
                        while cur.key() and _U64.unpack(cur.key())[0] < arg:
                            if not cur.delete():
                                break
                else:  # pragma: no cover - a bug
                    raise AssertionError(kind)
            if job.meta is not None:
                txn.put(_META_KEY, json.dumps(job.meta).encode(), db=self._meta_db)
            # Assert right before committing: disk and memory (when the job was taken) agree on
            # where the log ends.
            last_key = _U64.unpack(cur.key())[0] if cur.last() else 0
            assert last_key == job.last_index, (last_key, job.last_index)
        job.seconds = time.perf_counter() - started
        return job.seconds

    def _flushed(self, job: _FlushJob) -> None:
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

    def close(self) -> None:
        if self._env is not None:
            try:
                self.flush()
            finally:
                self._env.close()
                self._env = None
