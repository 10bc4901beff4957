"""A follower receiving a snapshot must not commit, or claim, entries the snapshot does not
prove it shares with the leader. Found by the simulation tier (tests/sim, seed 29 of the 3-node
run before the fix): an old leader cut off with uncommitted entries of its term came back
behind a compacted leader; the first snapshot chunk carried the leader's commit index and the
stock handler took it up to the old leader's own log end, applying entries never committed.

Each test shows pysyncobj's stock handler doing it, then the hardened one not doing it."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pysyncobj import SyncObj

from tests.raft.test_pysyncobj_hardening import Harness, _snapshot


def _chunks(h: Harness, index: int, term: int) -> list[tuple[bytes, bool, bool]]:
    """The snapshot at ``index`` as the leader streams it: a data chunk, then the empty last."""
    path = _snapshot(h, index, term)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return [(data, True, False), (b"", False, True)]


def _chunk_message(term: int, commit: int, chunk: tuple[bytes, bool, bool]) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit, "serialized": chunk}


def _deliver(h: Harness, message: dict[str, Any], stock: bool) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    h.so.transport.send = lambda node, msg: sent.append(msg) or True
    if stock:
        SyncObj._SyncObj__onMessageReceived(h.so, h.leader, message)
    else:
        h.so._SyncObj__onMessageReceived(h.leader, message)
    return sent


@pytest.mark.parametrize("stock", [True, False], ids=["stock", "hardened"])
def test_a_snapshot_chunk_does_not_commit_entries_it_does_not_prove(
    harness: Any, stock: bool
) -> None:
    # Entries 4-6 are an old leader's (term 2), never committed; the term-3 leader's commit
    # index is 10 and it is streaming a snapshot.
    h = harness([1, 1, 1, 2, 2, 2], current_term=3)
    first_chunk = _chunks(h, 8, 3)[0]
    _deliver(h, _chunk_message(3, 10, first_chunk), stock)
    if stock:
        assert h.so.raftCommitIndex == 6  # the old leader's entries, now "committed"
    else:
        assert h.so.raftCommitIndex == 1
    assert h.log()[-1] == (6, 2)  # nothing installed yet either way


@pytest.mark.parametrize("stock", [True, False], ids=["stock", "hardened"])
def test_an_installed_snapshot_answers_for_itself_not_for_the_entries_kept_after_it(
    harness: Any, stock: bool
) -> None:
    # The snapshot ends at entry 4 (term 1), which we hold: hook 4 keeps entries 5-6, from a
    # term-2 leader, that the term-3 leader may not have.
    h = harness([1, 1, 1, 1, 2, 2], current_term=3)
    replies: list[dict[str, Any]] = []
    for chunk in _chunks(h, 4, 1):
        replies += _deliver(h, _chunk_message(3, 10, chunk), stock)
    assert h.snapshots == [4]
    assert [(i, t) for i, t in h.log()][-2:] == [(5, 2), (6, 2)]  # kept in both cases
    (reply,) = [r for r in replies if r.get("type") == "next_node_idx"]
    assert reply["success"]
    if stock:
        # The leader would count entries 5 and 6 as ours, and commit its own 5 and 6 on that.
        assert reply["next_node_idx"] == 7 and h.so.raftCommitIndex == 6
    else:
        assert reply["next_node_idx"] == 5 and h.so.raftCommitIndex == 4
