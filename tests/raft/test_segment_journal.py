"""Adversarial tests of ``SegmentFileJournal``'s on-disk format (raft/segment_journal.py): torn
and stale records, damage, compaction, preallocation, migration from LMDB, fsync count.

The behaviour every journal shares is tests/raft/test_journal_contract.py's; these tests poke at
the files themselves. Records are found in a segment by their command bytes (each test's commands
are unique), using only the layout the module's docstring documents: a 16-byte segment header,
then records ``length u32 | crc32 u32 | kind u8 | body``, a PUT's body ``index u64 | term u64 |
command``."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from raft.journal import LmdbJournal
from raft.journal_core import Item, JournalCore, JournalError
from raft.segment_journal import KIND_DEL_TO, KIND_META, SegmentFileJournal, open_shard_journal

SEGMENT_BYTES = 4096
SEGMENT_HEADER_BYTES = 16
RECORD_HEADER_BYTES = 9  # length u32, crc32 u32, kind u8
PUT_PREFIX_BYTES = 16  # index u64, term u64
MAP_BYTES = 64 << 20


def open_journal(path: Path) -> SegmentFileJournal:
    return SegmentFileJournal(str(path), segment_bytes=SEGMENT_BYTES)


def command(i: int, size: int = 40, tag: bytes = b"cmd") -> bytes:
    head = b"%s-%06d-" % (tag, i)
    return head + b"x" * (size - len(head))


def fill(j: JournalCore, first: int, last: int, *, term: int = 1, size: int = 40) -> None:
    for i in range(first, last + 1):
        j.add(command(i, size), i, term)


def segments(path: Path) -> list[str]:
    return sorted(name for name in os.listdir(path) if name.endswith(".seg"))


def segment_sizes(path: Path) -> dict[str, int]:
    return {name: (path / name).stat().st_size for name in segments(path)}


def record_span(data: bytes, cmd: bytes) -> tuple[int, int]:
    """Where the PUT record carrying ``cmd`` starts and ends in a segment's bytes."""
    at = data.find(cmd)
    assert at >= 0 and data.find(cmd, at + 1) < 0, "commands must be unique in a segment"
    return at - PUT_PREFIX_BYTES - RECORD_HEADER_BYTES, at + len(cmd)


def segment_of(path: Path, cmd: bytes) -> str:
    holders = [name for name in segments(path) if cmd in (path / name).read_bytes()]
    assert len(holders) == 1, holders
    return holders[0]


def indexes_by_segment(path: Path, last: int, size: int) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {name: [] for name in segments(path)}
    for name in found:
        data = (path / name).read_bytes()
        found[name] = [i for i in range(1, last + 1) if command(i, size) in data]
    return found


def damage(path: Path, at: int, new: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)


def flip_byte(path: Path, at: int) -> None:
    old = path.read_bytes()[at]
    damage(path, at, bytes((old ^ 0xFF,)))


def log_of(j: SegmentFileJournal) -> list[tuple[int, int]]:
    return [(index, term) for _, index, term in j[:]]


# -- 1. a torn flush at the tail ------------------------------------------------------------------


@pytest.mark.parametrize("tear", ["second_half_zero", "flipped_body_byte", "garbage_length"])
def test_a_torn_flush_at_the_tail_is_dropped_logged_and_zeroed_on_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tear: str
) -> None:
    wal = tmp_path / "wal"
    j = open_journal(wal)
    fill(j, 1, 3)
    j.flush()
    j.add(command(4, 200), 4, 1)
    j.flush()  # the flush a crash tears
    j.close()
    [name] = segments(wal)
    seg = wal / name
    data = seg.read_bytes()
    start, end = record_span(data, command(4, 200))
    _, end_of_3 = record_span(data, command(3))
    assert start == end_of_3  # record 4 is the tail: nothing of the earlier flush is touched
    if tear == "second_half_zero":  # the later sectors of the write never reached the disk
        damage(seg, (start + end) // 2, bytes(end - (start + end) // 2))
    elif tear == "flipped_body_byte":
        flip_byte(seg, end - 3)
    else:  # the length field itself is garbage: the record would run past the file's end
        damage(seg, start, b"\x7f\xff\xff\x00")
    size = seg.stat().st_size

    with caplog.at_level(logging.WARNING, logger="raft.segment_journal"):
        after = open_journal(wal)
    try:
        assert after[:] == [(command(i), i, 1) for i in (1, 2, 3)]
        assert after.durable_index == 3
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any("torn" in r.getMessage() and name in r.getMessage() for r in warnings)
        on_disk = seg.read_bytes()
        assert len(on_disk) == size
        assert on_disk[:end_of_3] == data[:end_of_3]  # what the previous flush left, intact
        assert on_disk[end_of_3:] == bytes(size - end_of_3)  # and nothing after it
    finally:
        after.close()


# -- 2. a stale record behind a new end -----------------------------------------------------------


def _rewrite_over_a_torn_flush(wal: Path) -> list[Item]:
    """Flush 1-3 and 4-6; damage record 4 (a torn write whose records 5 and 6 did reach the
    disk); reopen; write a new entry 4 (term 2) of the old 4's length, so its record ends exactly
    where the old 5 starts; reopen again. -> the log read back."""
    j = open_journal(wal)
    fill(j, 1, 3)
    j.flush()
    fill(j, 4, 6)
    j.flush()
    j.close()
    [name] = segments(wal)
    seg = wal / name
    data = seg.read_bytes()
    start4, end4 = record_span(data, command(4))
    start5, _ = record_span(data, command(5))
    assert end4 == start5
    flip_byte(seg, end4 - 1)

    j = open_journal(wal)
    assert log_of(j) == [(1, 1), (2, 1), (3, 1)]
    new4 = command(4, tag=b"new")
    assert len(new4) == len(command(4))
    j.add(new4, 4, 2)
    j.flush()
    j.close()
    assert record_span(seg.read_bytes(), new4) == (start4, end4)  # ends where the old 5 began
    after = open_journal(wal)
    try:
        return list(after[:])
    finally:
        after.close()


def test_a_stale_record_behind_a_new_end_is_never_read_back(tmp_path: Path) -> None:
    log = _rewrite_over_a_torn_flush(tmp_path / "wal")
    assert log == [
        (command(1), 1, 1),
        (command(2), 2, 1),
        (command(3), 3, 1),
        (command(4, tag=b"new"), 4, 2),
    ]


def test_the_stale_record_scenario_resurrects_old_entries_without_zeroing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of the test above: the scenario really leaves old 5 and 6 readable
    right behind the new 4, so only the zeroing on load keeps them out of the log."""
    monkeypatch.setattr(SegmentFileJournal, "_zero", staticmethod(lambda *_: None))
    log = _rewrite_over_a_torn_flush(tmp_path / "wal")
    assert [(index, term) for _, index, term in log] == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 2),
        (5, 1),
        (6, 1),
    ]


# -- 3. damage to data that was fsync'd, and foreign segments -------------------------------------


def _three_segments(wal: Path) -> int:
    """A journal of at least three segments, closed. -> its last index."""
    j = open_journal(wal)
    last = 0
    while j.segment_count < 3:
        fill(j, last + 1, last + 4, size=300)
        last += 4
        j.flush()
    j.close()
    return last


@pytest.mark.parametrize("which", ["first_record", "last_record"])
def test_damage_in_an_earlier_segment_refuses_to_open_naming_the_segment(
    tmp_path: Path, which: str
) -> None:
    wal = tmp_path / "wal"
    last = _three_segments(wal)
    first_segment = segments(wal)[0]
    held = indexes_by_segment(wal, last, 300)[first_segment]
    victim = held[0] if which == "first_record" else held[-1]
    seg = wal / first_segment
    _, end = record_span(seg.read_bytes(), command(victim, 300))
    flip_byte(seg, end - 5)
    with pytest.raises(JournalError, match=first_segment) as refused:
        open_journal(wal)
    assert "does not check" in str(refused.value)


def test_a_missing_middle_segment_refuses_to_open(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    _three_segments(wal)
    names = segments(wal)
    os.unlink(wal / names[1])
    with pytest.raises(JournalError, match=r"missing segments 2\.\.2"):
        open_journal(wal)


@pytest.mark.parametrize(
    ("at", "new", "message"),
    [
        (4, b"\x02", "format version 2; this node reads 1"),
        (0, b"XXXX", "is not a FluxMQ journal segment"),
    ],
)
@pytest.mark.parametrize("position", ["first", "last"])
def test_a_segment_of_another_format_or_magic_refuses_to_open(
    tmp_path: Path, at: int, new: bytes, message: str, position: str
) -> None:
    wal = tmp_path / "wal"
    _three_segments(wal)
    name = segments(wal)[0 if position == "first" else -1]
    damage(wal / name, at, new)
    with pytest.raises(JournalError, match=message) as refused:
        open_journal(wal)
    assert name in str(refused.value)


def test_a_segment_under_another_segments_name_refuses_to_open(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    _three_segments(wal)
    first, second = segments(wal)[:2]
    shutil.copyfile(wal / first, wal / second)
    with pytest.raises(JournalError, match="says it is segment 1"):
        open_journal(wal)


# -- 4. compaction --------------------------------------------------------------------------------


def test_compaction_deletes_only_segments_wholly_behind_it_and_reopens_the_same(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "wal"
    j = open_journal(wal)
    j.setCurrentTerm(3, "n2")  # its only META record is in segment 1, which compaction deletes
    for first in range(1, 60, 3):
        fill(j, first, first + 2, term=3, size=300)
        j.flush()
    j.setRaftCommitIndex(50)  # durable already: rides with the next flush
    fill(j, 61, 61, term=3, size=300)
    j.flush()
    held = indexes_by_segment(wal, 61, 300)
    names = list(held)
    assert len(names) >= 5
    keep_from = held[names[3]][0] + 1  # in the middle of the fourth segment
    j.deleteEntriesTo(keep_from - 1)  # positions: entries 1..keep_from-1 go

    gone = [name for name in names if max(held[name]) < keep_from]
    assert gone == names[:3]
    assert segments(wal) == names[3:]
    expected = (list(j[:]), j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex())
    assert expected[0][0][1] == keep_from and expected[1:] == (3, "n2", 50)
    j.close()

    after = open_journal(wal)
    try:
        assert (
            list(after[:]),
            after.getCurrentTerm(),
            after.getVotedForNodeId(),
            after.getRaftCommitIndex(),
        ) == expected
        # A second compaction, two segments after the first: the trim point is carried too.
        fill(after, 62, 80, term=3, size=300)
        after.flush()
        after.deleteEntriesTo(30)
        expected = (list(after[:]), 3, "n2", 50)
    finally:
        after.close()
    again = open_journal(wal)
    try:
        assert (
            list(again[:]),
            again.getCurrentTerm(),
            again.getVotedForNodeId(),
            again.getRaftCommitIndex(),
        ) == expected
    finally:
        again.close()


def test_compacting_everything_never_deletes_the_segment_being_written(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    j = open_journal(wal)
    j.setCurrentTerm(2, "n1")
    for first in range(1, 40, 4):
        fill(j, first, first + 3, term=2, size=300)
        j.flush()
    assert j.segment_count >= 3
    being_written = segments(wal)[-1]
    j.deleteEntriesTo(len(j))  # every entry goes
    assert len(j) == 0
    assert segments(wal) == [being_written] and j.segment_count == 1
    j.close()

    after = open_journal(wal)
    try:
        assert len(after) == 0 and after.last_index == 0
        assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (2, "n1")
        after.add(command(41), 41, 2)  # the log goes on after the trim point
        after.flush()
    finally:
        after.close()
    again = open_journal(wal)
    try:
        assert again[:] == [(command(41), 41, 2)]
    finally:
        again.close()


def carried_bytes(data: bytes) -> int:
    """Where the first record after a segment's carried META / DEL_TO records starts."""
    at = SEGMENT_HEADER_BYTES
    while data[at + 8] in (KIND_META, KIND_DEL_TO):
        at += RECORD_HEADER_BYTES + int.from_bytes(data[at : at + 4], "big")
    return at


def test_term_and_vote_survive_compaction_after_a_roll_whose_first_write_was_lost(
    tmp_path: Path,
) -> None:
    """Term and vote are never lost. A crash during the flush that starts a new segment loses
    the records of that flush, never the META the segment continues from (it is written with
    the segment's creation, durably, before the segment has a name); once compaction deletes
    the older segments, that META is the one left on disk."""
    wal = tmp_path / "wal"
    j = open_journal(wal)
    j.setCurrentTerm(7, "n3")  # the only META record written by a flush: in segment 1
    last = 0
    while j.segment_count < 2:
        fill(j, last + 1, last + 2, term=7, size=600)
        last += 2
        j.flush()
    j.close()
    second = wal / segments(wal)[1]
    data = second.read_bytes()
    start = carried_bytes(data)
    assert start > SEGMENT_HEADER_BYTES, "segment 2 does not start with the META it carries"
    # The crash: segment 2 exists (created durably), the first flush into it never reached
    # the disk.
    damage(second, start, bytes(len(data) - start))

    j = open_journal(wal)
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (7, "n3")
    kept = j.last_index
    assert kept == last - 2
    fill(j, kept + 1, kept + 2, term=7, size=600)
    j.flush()
    j.deleteEntriesTo(len(j) - 1)  # everything in segment 1 is behind the trim point
    assert segments(wal) == [second.name]
    j.close()

    after = open_journal(wal)
    try:
        assert log_of(after) == [(kept + 2, 7)]
        assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (7, "n3")
    finally:
        after.close()


def test_a_log_restarted_below_an_old_trim_point_survives_a_segment_roll(tmp_path: Path) -> None:
    """After ``clear()`` the log may restart at any index (the contract suite's
    rule), also below an earlier trim point; the trim point carried into the next segment must
    not delete the restarted log on reload."""
    wal = tmp_path / "wal"
    j = open_journal(wal)
    fill(j, 1, 20)
    j.flush()
    j.deleteEntriesTo(10)  # positions: keeps 11..20
    j.clear()
    j.add(b"snap-prev", 5, 3)
    j.add(b"snap-last", 6, 3)
    j.flush()
    index = 7
    while j.segment_count < 2:
        j.add(command(index, 600), index, 3)
        index += 1
        j.flush()
    expected = list(j[:])
    assert expected[0][1] == 5
    j.close()
    after = open_journal(wal)
    try:
        assert log_of(after) == [(index, term) for _, index, term in expected]
        assert list(after[:]) == expected
    finally:
        after.close()


# -- 5. preallocation -----------------------------------------------------------------------------


def watch_growing_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every ``os.pwrite`` that would extend its file: (offset, bytes, file size)."""
    real_pwrite = os.pwrite
    growing: list[tuple[int, int, int]] = []

    def checked_pwrite(fd: int, data: bytes, offset: int) -> int:
        size = os.fstat(fd).st_size
        if offset + len(data) > size:
            growing.append((offset, len(data), size))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", checked_pwrite)
    return growing


def test_a_flush_never_changes_a_segment_files_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "wal"
    growing = watch_growing_writes(monkeypatch)
    j = open_journal(wal)
    sizes = segment_sizes(wal)
    assert sizes == {"0000000000000001.seg": SEGMENT_BYTES}
    for first in range(1, 50, 5):
        fill(j, first, first + 4, size=150)
        j.flush()
        now = segment_sizes(wal)
        for name, size in now.items():
            assert size == sizes.get(name, SEGMENT_BYTES), name
        sizes = now
    assert len(sizes) >= 3  # the flushes crossed segment boundaries
    assert growing == []
    j.close()
    after = open_journal(wal)
    try:
        assert after[:] == [(command(i, 150), i, 1) for i in range(1, 51)]
    finally:
        after.close()


def test_a_job_larger_than_a_segment_gets_a_segment_of_its_own_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "wal"
    growing = watch_growing_writes(monkeypatch)  # its segment is made big enough beforehand
    j = open_journal(wal)
    fill(j, 1, 2)
    j.flush()
    before = segment_sizes(wal)
    fill(j, 3, 5, size=3000)  # about 9 KB in one job
    j.setCurrentTerm(4, "n9")  # flushes, with the META record in the same job
    now = segment_sizes(wal)
    assert {name: now[name] for name in before} == before
    [big] = [name for name in now if name not in before]
    assert now[big] > 3 * 3000
    assert all(segment_of(wal, command(i, 3000)) == big for i in (3, 4, 5))
    fill(j, 6, 6)
    j.flush()  # the big segment is full: the next flush starts a segment of the usual size
    later = segment_sizes(wal)
    assert {name: later[name] for name in now} == now
    [next_one] = [name for name in later if name not in now]
    assert later[next_one] == SEGMENT_BYTES
    assert growing == []
    expected = list(j[:])
    j.close()
    after = open_journal(wal)
    try:
        assert list(after[:]) == expected and len(expected) == 6
        assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (4, "n9")
    finally:
        after.close()


# -- 6. migration from LMDB -----------------------------------------------------------------------


def _lmdb_journal(old: Path) -> tuple[list[Item], tuple[int, str | None, int]]:
    """An LMDB journal of the earlier format (compacted, so it starts at 4), closed. -> its
    entries and meta."""
    lj = LmdbJournal(str(old), map_size_bytes=MAP_BYTES)
    fill(lj, 1, 30, term=2, size=300)
    lj.flush()
    lj.deleteEntriesTo(3)  # positions: entries 1..3 go
    lj.setRaftCommitIndex(25)  # a commit index alone is not flushed: the term change carries it
    lj.setCurrentTerm(5, "n4")
    lj.close()
    written = LmdbJournal(str(old), map_size_bytes=MAP_BYTES)  # what is on disk
    try:
        entries = list(written[:])
        meta = (written.getCurrentTerm(), written.getVotedForNodeId(), written.getRaftCommitIndex())
    finally:
        written.close()
    return entries, meta


def _state(j: SegmentFileJournal) -> tuple[list[Item], tuple[int, str | None, int]]:
    return list(j[:]), (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex())


def test_open_shard_journal_migrates_an_lmdb_journal_and_removes_it(tmp_path: Path) -> None:
    entries, meta = _lmdb_journal(tmp_path / "journal")
    assert entries[0][1] == 4 and meta == (5, "n4", 25)
    j = open_shard_journal(str(tmp_path), segment_bytes=SEGMENT_BYTES)
    try:
        assert _state(j) == (entries, meta)
    finally:
        j.close()
    assert sorted(os.listdir(tmp_path)) == ["wal"]
    again = open_shard_journal(str(tmp_path), segment_bytes=SEGMENT_BYTES)
    try:
        assert _state(again) == (entries, meta)
    finally:
        again.close()


def test_open_shard_journal_redoes_a_migration_that_a_crash_interrupted(tmp_path: Path) -> None:
    entries, meta = _lmdb_journal(tmp_path / "journal")
    staging = tmp_path / "wal.migrating"
    # What an interrupted copy leaves: a partial staging directory with a stale segment.
    partial = open_journal(staging)
    partial.add(b"stale", 1, 9)
    partial.setCurrentTerm(9, "stale")
    partial.close()
    (staging / "0000000000000002.seg.tmp").write_bytes(b"junk")
    j = open_shard_journal(str(tmp_path), segment_bytes=SEGMENT_BYTES)
    try:
        assert _state(j) == (entries, meta)
    finally:
        j.close()
    assert sorted(os.listdir(tmp_path)) == ["wal"]


def test_open_shard_journal_after_a_crash_past_the_rename_uses_wal_and_drops_the_old(
    tmp_path: Path,
) -> None:
    _lmdb_journal(tmp_path / "journal")
    wal = open_journal(tmp_path / "wal")  # differs from the LMDB journal: which one is used shows
    wal.add(b"from-wal", 1, 6)
    wal.setCurrentTerm(6, "n5")
    wal.close()
    j = open_shard_journal(str(tmp_path), segment_bytes=SEGMENT_BYTES)
    try:
        assert _state(j) == ([(b"from-wal", 1, 6)], (6, "n5", 1))
    finally:
        j.close()
    assert sorted(os.listdir(tmp_path)) == ["wal"]


# -- 7. one fdatasync per flush; leftovers --------------------------------------------------------


def test_one_flush_of_many_entries_is_exactly_one_fdatasync_on_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "wal"
    j = open_journal(wal)
    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    fill(j, 1, 60)  # about 3.5 KB: one segment
    j.setRaftCommitIndex(60)
    assert synced == [os.path.realpath(wal / "0000000000000001.seg")]
    synced.clear()
    fill(j, 61, 120)  # this job does not fit: it starts segment 2
    j.flush()
    assert synced == [os.path.realpath(wal / "0000000000000002.seg")]
    j.close()


def test_a_leftover_segment_tmp_is_removed_on_open(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    j = open_journal(wal)
    fill(j, 1, 3)
    j.close()
    leftover = wal / "0000000000000002.seg.tmp"  # a segment whose creation a crash interrupted
    leftover.write_bytes(b"\x01" * SEGMENT_BYTES)
    after = open_journal(wal)
    try:
        assert not leftover.exists()
        assert log_of(after) == [(1, 1), (2, 1), (3, 1)]
        fill(after, 4, 40, size=200)
        after.flush()  # segment 2 is created for real
    finally:
        after.close()
    assert segments(wal)[:2] == ["0000000000000001.seg", "0000000000000002.seg"]
    again = open_journal(wal)
    try:
        assert [i for _, i, _ in again[:]] == list(range(1, 41))
    finally:
        again.close()


# -- a short write --------------------------------------------------------------------------------


def test_a_short_write_is_never_taken_for_a_durable_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.pwrite`` may write fewer bytes than asked (its documented return value);
    a flush either writes the rest or fails, never reports entries durable that are not on
    disk."""
    wal = tmp_path / "wal"
    j = open_journal(wal)
    fill(j, 1, 3)
    j.flush()
    real_pwrite = os.pwrite
    shorted: list[int] = []

    def short_pwrite(fd: int, data: bytes, offset: int) -> int:
        if not shorted and len(data) > 1:
            shorted.append(len(data))
            return real_pwrite(fd, data[: len(data) // 2], offset)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", short_pwrite)
    fill(j, 4, 6)
    try:
        j.flush()
    except (OSError, JournalError):
        return  # refused: nothing was promised
    monkeypatch.undo()
    assert shorted and j.durable_index == 6
    crashed = tmp_path / "crashed"
    shutil.copytree(wal, crashed)  # what a crash now leaves
    after = open_journal(crashed)
    try:
        assert log_of(after) == [(i, 1) for i in range(1, 7)]
    finally:
        after.close()
        j.close()


def test_after_a_failed_fdatasync_the_journal_takes_no_more_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fdatasync nothing tells what reached the disk (the kernel may have
    dropped the dirty pages and a retry would then succeed): the journal refuses every later
    write, so nothing written after the failure is ever reported durable."""
    j = open_journal(tmp_path / "wal")
    fill(j, 1, 3)
    j.flush()
    real_fdatasync = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    fill(j, 4, 4)
    with pytest.raises(JournalError, match="write failed"):
        j.flush()
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    fill(j, 5, 5)
    with pytest.raises(JournalError, match="failed earlier"):
        j.flush()
    assert j.durable_index == 3
    j._close_fd()
