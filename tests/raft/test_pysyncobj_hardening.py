"""The corrections raft/_pysyncobj.py makes to pysyncobj 0.3.17, each shown against the stock
behaviour it replaces (shared/notes/RAFT.md), and the assumptions it makes about pysyncobj's
internals (this file fails first if an upgrade moves them)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pysyncobj import SyncObj

from raft import _pysyncobj, snapshot_file
from raft._pysyncobj import HardenedSyncObj, SyncObjConf
from raft.segment_journal import SegmentFileJournal
from raft.wire_transport import WireTransport
from tests.raft.helpers import free_ports

NOOP = b"\x01"


def _cmd(i: int) -> bytes:
    return b"\x00" + f"c{i}".encode()


def _read_snapshot(path: str) -> tuple[Any, Any, Any]:
    info = snapshot_file.read_info(path)
    return info.last, info.prev, list(info.members)


class Harness:
    """One HardenedSyncObj, not ticking, whose peers do not run: messages are fed by hand."""

    def __init__(self, root: str, terms: list[int], current_term: int) -> None:
        self.root = root
        self.journal = SegmentFileJournal(os.path.join(root, "journal"))
        for i, term in enumerate(terms, start=1):
            self.journal.add(NOOP if i == 1 else _cmd(i), i, term)
        self.journal.setCurrentTerm(current_term, None)
        self.journal.flush()
        me, peer1, peer2 = (f"127.0.0.1:{p}" for p in free_ports(3))
        self.snapshots: list[int] = []
        conf = SyncObjConf(
            password=None,
            autoTick=False,
            appendEntriesUseBatch=False,
            fullDumpFile=os.path.join(root, "snapshot"),
            serializer=lambda *_: None,
            deserializer=_read_snapshot,
            useFork=False,
            dynamicMembershipChange=True,
            bindAddress=me,
            maxBindRetries=1,
        )
        self.so = HardenedSyncObj(
            me,
            [peer1, peer2],
            conf,
            self.journal,
            _pysyncobj.create_poller(),
            lambda index, frame: index,
            lambda path, info: self.snapshots.append(info.index),
            wire_secret="s",
        )
        self.leader = next(n for n in self.so.otherNodes if n.id == peer1)

    def log(self) -> list[tuple[int, int]]:
        return [(idx, term) for _, idx, term in self.journal[:]]

    def append(
        self,
        term: int,
        prev: int,
        prev_term: int,
        entries: list[tuple[int, int]],
        commit: int,
        stock: bool = False,
    ) -> None:
        msg: dict[str, Any] = {
            "type": "append_entries",
            "term": term,
            "commit_index": commit,
            "prevLogIdx": prev,
            "prevLogTerm": prev_term,
            "entries": [(_cmd(i), i, t) for i, t in entries],
        }
        if stock:
            SyncObj._SyncObj__onMessageReceived(self.so, self.leader, msg)
        else:
            self.so._SyncObj__onMessageReceived(self.leader, msg)

    def close(self) -> None:
        self.so.destroy()


def test_pysyncobj_internals_we_rely_on_are_present() -> None:
    assert _pysyncobj.check_assumptions() == []


def test_replicas_talk_over_fluxmqs_wire_by_default(harness: Any) -> None:
    h = harness([1])
    assert isinstance(h.so.transport, WireTransport)
    assert h.so.encryptor is None  # no Fernet under the wire


def test_pysyncobjs_fernet_password_cannot_be_turned_on(tmp_path: Any) -> None:
    """Peers are authenticated by raft/wire.py; a Fernet password would put pysyncobj's
    per-message encryption back (and its handshake under ours)."""
    journal = SegmentFileJournal(str(tmp_path / "journal"))
    conf = SyncObjConf(password="s", autoTick=False, useFork=False)
    with pytest.raises(ValueError, match="leave password unset"):
        HardenedSyncObj(
            "127.0.0.1:1",
            [],
            conf,
            journal,
            _pysyncobj.create_poller(),
            lambda index, frame: index,
            lambda path, info: None,
            wire_secret="s",
        )
    journal.close()


def test_a_stale_append_of_matching_entries_does_not_delete_later_entries(harness: Any) -> None:
    stock = harness([1, 1, 1, 1, 1])
    stock.append(term=1, prev=2, prev_term=1, entries=[(3, 1)], commit=3, stock=True)
    # Stock pysyncobj deletes entries 4 and 5, which this follower may have acknowledged.
    assert stock.log() == [(1, 1), (2, 1), (3, 1)]

    fixed = harness([1, 1, 1, 1, 1])
    fixed.append(term=1, prev=2, prev_term=1, entries=[(3, 1)], commit=3)
    assert fixed.log() == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert fixed.so.raftCommitIndex == 3


def test_a_real_conflict_still_truncates_from_the_first_conflicting_entry(harness: Any) -> None:
    h = harness([1, 1, 1, 1, 1], current_term=2)
    h.append(term=2, prev=2, prev_term=1, entries=[(3, 1), (4, 2)], commit=2)
    assert h.log() == [(1, 1), (2, 1), (3, 1), (4, 2)]


def test_a_heartbeat_never_commits_entries_not_proven_to_match_the_leader(harness: Any) -> None:
    # Entries 4 and 5 are from term 1; the term-2 leader's log matches only up to 3.
    h = harness([1, 1, 1, 1, 1], current_term=2)
    h.append(term=2, prev=3, prev_term=1, entries=[], commit=5)
    assert h.so.raftCommitIndex == 3
    assert h.log()[-1] == (5, 1)  # kept until a real conflict shows up


def test_matching_entries_already_present_are_not_rewritten(harness: Any) -> None:
    h = harness([1, 1, 1])
    fsyncs = h.journal.fsyncs
    h.append(term=1, prev=1, prev_term=1, entries=[(2, 1), (3, 1)], commit=3)
    assert h.log() == [(1, 1), (2, 1), (3, 1)]
    h.journal.flush()
    assert h.journal.fsyncs - fsyncs <= 1  # commit index only, no entry rewritten


def _sent(h: Harness) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    h.so.transport.send = lambda node, message: sent.append(message) or True
    return sent


def test_an_answer_carries_the_term_of_the_append_it_answers(harness: Any) -> None:
    # Hook 12. Stock pysyncobj's answer says how far the log matches, not for which term.
    h = harness([1, 1, 1], current_term=2)
    sent = _sent(h)
    h.append(term=3, prev=3, prev_term=1, entries=[(4, 3)], commit=1)  # a new leader's
    h.append(term=3, prev=7, prev_term=3, entries=[], commit=1)  # beyond our log: reset
    assert [(m["next_node_idx"], m["success"], m["reset"], m["term"]) for m in sent] == [
        (5, True, False, 3),
        (5, False, True, 3),
    ]
    stock = harness([1, 1, 1], current_term=2)
    sent = _sent(stock)
    stock.append(term=3, prev=3, prev_term=1, entries=[(4, 3)], commit=1, stock=True)
    assert "term" in sent[0]  # the stock handler sends through the replaced method too


def _leader_of_term(h: Harness, term: int) -> None:
    h.journal.setCurrentTerm(term, h.so.selfNode.id)
    h.so._SyncObj__raftCurrentTerm = term
    _sent(h)  # the appends it sends on taking office go nowhere
    h.so._SyncObj__onBecomeLeader()  # its no-op at the log end + 1, of this term
    assert h.so._isLeader()


@pytest.mark.parametrize("stock", [True, False], ids=["stock", "hardened"])
def test_a_leader_does_not_count_an_answer_to_its_appends_of_an_earlier_term(
    harness: Any, stock: bool
) -> None:
    # This node led term 3 and sent entries 2-4 to a follower, whose answer (success up to 4)
    # was delayed; other leaders replaced entries 2.. since, and it leads again in term 7 with
    # its no-op at 4. The answer says nothing about the entry now at 4 (tests/sim/
    # stale_answer.py has the whole schedule).
    h = harness([1, 4, 6], current_term=6)
    _leader_of_term(h, 7)
    assert h.log()[-1] == (4, 7)
    follower = h.leader  # a peer
    stale = {"type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True}
    if stock:
        SyncObj._SyncObj__onMessageReceived(h.so, follower, stale)
        assert h.so.match_index[follower.id] == 4  # counted: a majority of 3 "holds" entry 4
        return
    h.so._SyncObj__onMessageReceived(follower, {**stale, "term": 3})
    assert h.so.match_index[follower.id] == 0
    h.so._SyncObj__onMessageReceived(follower, {**stale, "term": 7})  # an answer of term 7
    assert h.so.match_index[follower.id] == 4


def test_an_answer_without_a_term_from_a_node_before_hook_12_counts_as_before(
    harness: Any,
) -> None:
    h = harness([1, 1], current_term=1)
    _leader_of_term(h, 2)
    answer = {"type": "next_node_idx", "next_node_idx": 4, "reset": False, "success": True}
    h.so._SyncObj__onMessageReceived(h.leader, answer)
    assert h.so.match_index[h.leader.id] == 3


def _snapshot(h: Harness, index: int, term: int) -> str:
    state = os.path.join(h.root, "state.bin")
    with open(state, "wb") as f:
        f.write(b"state")
    path = h.so.conf.fullDumpFile
    snapshot_file.write(
        path,
        (_cmd(index), index, term),
        (_cmd(index - 1), index - 1, term),
        [h.so.selfNode.id, *(n.id for n in h.so.otherNodes)],
        state,
    )
    return str(path)


def test_loading_a_snapshot_at_start_keeps_the_entries_written_after_it(harness: Any) -> None:
    # A crash between writing the snapshot and trimming the journal: the journal still starts at
    # 1 and goes past the snapshot. Stock pysyncobj cleared it down to the snapshot's two entries.
    h = harness([1] * 10)
    _snapshot(h, 6, 1)
    h.so._SyncObj__loadDumpFile(clearJournal=False)
    assert [i for i, _ in h.log()] == list(range(1, 11))
    assert h.so.raftLastApplied == 6
    assert h.snapshots == [6]


def test_stock_snapshot_loading_loses_the_entries_after_it(harness: Any) -> None:
    h = harness([1] * 10)
    _snapshot(h, 6, 1)
    SyncObj._SyncObj__loadDumpFile(h.so, clearJournal=False)
    assert h.so.raftLastApplied == 6  # it did load the snapshot ...
    assert h.log() == [(5, 1), (6, 1)]  # ... and dropped entries 7-10, acknowledged or not


def test_a_snapshot_the_journal_does_not_contain_resets_the_log_to_it(harness: Any) -> None:
    h = harness([1, 1, 1])
    _snapshot(h, 8, 2)
    h.so._SyncObj__loadDumpFile(clearJournal=True)
    assert h.log() == [(7, 2), (8, 2)]
    assert h.so.raftLastApplied == 8
    assert h.so.raftCommitIndex <= 8


def test_the_commit_index_read_at_start_is_clamped_to_the_log_end(tmp_path: Any) -> None:
    j = SegmentFileJournal(str(tmp_path / "j"))
    for i in range(1, 6):
        j.add(_cmd(i), i, 1)
    j.setRaftCommitIndex(50)
    j.close()
    j = SegmentFileJournal(str(tmp_path / "j"))
    assert j.getRaftCommitIndex() == 5
    j.close()
