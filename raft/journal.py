"""LmdbJournal: a durable Raft log behind pysyncobj's ``Journal`` interface.

pysyncobj's own FileJournal is an mmap that is never fsync'd while running, and its term/vote
file is not fsync'd either (shared/notes/RAFT.md). This journal keeps the log in memory and
mirrors every change into LMDB (the rules are raft/journal_core.py's, shared with the in-memory
twin): changes are buffered and made durable by a flush, one write transaction and one fsync for
everything pending, however many entries. The transport's outbox flushes before any message that
promises what this node holds leaves it (acknowledgements, votes: raft/outbox.py) and the
journal flushes before the commit index moves, so no node ever acknowledges, votes for or applies
what is not on its disk.

Keys are log indexes (u64 big endian, so LMDB's order is log order); values are the term (u64)
followed by the command bytes. Term, vote and commit index live in a second database.
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any

import lmdb

from raft.journal_core import FlushJob, Item, JournalCore, JournalError, Meta

__all__ = ["Item", "JournalError", "LmdbJournal"]

_U64 = struct.Struct(">Q")
_META_KEY = b"meta"


class LmdbJournal(JournalCore):
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
        entries, meta = self._load()
        super().__init__(entries, meta)

    def _load(self) -> tuple[list[Item], Meta]:
        entries: list[Item] = []
        meta: Meta = (0, None, 1)
        with self._env.begin() as txn:
            raw = txn.get(_META_KEY, db=self._meta_db)
            if raw is not None:
                stored = json.loads(raw)
                meta = (int(stored["term"]), stored["voted_for"], int(stored["commit_index"]))
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
                entries.append((bytes(value[8:]), index, term))
        return entries, meta

    def _write(self, job: FlushJob) -> float:
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
                term, voted_for, commit_index = job.meta
                record = {"term": term, "voted_for": voted_for, "commit_index": commit_index}
                txn.put(_META_KEY, json.dumps(record).encode(), db=self._meta_db)
            # Assert right before committing: disk and memory (when the job was taken) agree on
            # where the log ends.
            last_key = _U64.unpack(cur.key())[0] if cur.last() else 0
            assert last_key == job.last_index, (last_key, job.last_index)
        job.seconds = time.perf_counter() - started
        return job.seconds

    def close(self) -> None:
        if self._env is not None:
            try:
                self.flush()
            finally:
                self._env.close()
                self._env = None
