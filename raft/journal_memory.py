"""MemoryJournal: the in-memory twin of ``LmdbJournal``, for the simulation tier (tests/sim).

Same interface and the same rules (raft/journal_core.py, shared): changes are pending until a
flush, and
``crash()`` returns the journal a restarted node would load, holding exactly what was flushed
(what ``LmdbJournal`` reloads after a kill -9 between two flushes). The durable copy is kept
apart from the live log and is changed only by replaying the pending operations in order, as
``LmdbJournal.flush`` replays them into one write transaction, so the two cannot drift apart
by construction of a shortcut (such as copying the live log at flush time).

tests/raft/test_journal_contract.py runs one behaviour suite against both journals.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from raft.journal_core import FlushJob, Item, JournalCore, JournalError


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


class MemoryJournal(JournalCore):
    """A Raft log in memory whose "disk" is a second copy updated only by a flush."""

    def __init__(self, durable: DurableJournalState | None = None) -> None:
        self._disk = durable.copy() if durable is not None else DurableJournalState()
        self._closed = False
        disk = self._disk
        super().__init__(list(disk.entries), (disk.term, disk.voted_for, disk.commit_index))

    def _write(self, job: FlushJob) -> float:
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
        return 0.0

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

    def close(self) -> None:
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
