"""What a replicated round costs in messages (raft/_pysyncobj.py hooks 8 and 9): the commit
index rides with the next append instead of an append of its own, so a follower handles one
message per round of a steady load, and pysyncobj's self-pipe is gone. Followers still learn
every commit (they converge) when no further append comes."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from raft import Entry, frames, pysyncobj_shard
from tests.raft.helpers import FAST
from tests.raft.test_replication import WAIT_S, followers, running, sole_leader

ROUNDS = 60


async def follower_messages_per_round(root: Path, commit_notice_ms: int) -> float:
    timings = dataclasses.replace(FAST, commit_notice_ms=commit_notice_ms)
    async with running(root, timings=timings) as c:
        leader = await sole_leader(c)
        for k in range(5):  # connections up, the first rounds done
            await leader.propose(b"warm-%d" % k)
        await c.converged(WAIT_S)
        received_before = {
            f.address: f.syncobj.transport.messages_received  # type: ignore[union-attr]
            for f in followers(c, leader)
        }
        for k in range(ROUNDS):
            await leader.propose(b"round-%d" % k)  # one at a time: one entry per round
        await c.converged(WAIT_S)
        received = [
            f.syncobj.transport.messages_received - received_before[f.address]  # type: ignore[union-attr]
            for f in followers(c, leader)
        ]
        for shard in c.shards.values():
            assert shard.acked_not_durable_on_majority == 0
        return sum(received) / len(received) / ROUNDS


async def test_a_commit_index_rides_with_the_next_append_instead_of_a_message_of_its_own(
    tmp_path: Path,
) -> None:
    riding = await follower_messages_per_round(tmp_path / "riding", commit_notice_ms=20)
    alone = await follower_messages_per_round(tmp_path / "alone", commit_notice_ms=0)
    # Stock: an append with the entry and one with its commit index, per round (plus the
    # heartbeats of the run). Riding: the entry's append carries the previous commit index.
    assert alone >= 1.8, alone
    assert riding <= 0.75 * alone, (riding, alone)


async def test_the_driver_thread_never_writes_a_byte_to_wake_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock pysyncobj writes to its own pipe on every command it is handed, from the very
    thread that will take the command in the same tick: a write, a read and a driver round for
    nothing."""
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        driver_thread = c.drivers[leader.address]._thread
        pipe_writes_by_driver = [0]
        real_write = os.write

        def counting_write(fd: int, data: bytes) -> int:
            if threading.current_thread() is driver_thread and data == b"o":
                pipe_writes_by_driver[0] += 1
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", counting_write)
        for k in range(20):
            await leader.propose(b"p%d" % k)
        await c.converged(WAIT_S)
        assert pipe_writes_by_driver == [0]


async def test_a_follower_answers_an_append_before_applying_what_it_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the commit index riding on the next entry, a follower's round both holds a new entry
    and commits the previous one; the answer for the new entry is on the leader's commit path,
    the apply of the previous one is not, so the answer leaves first: answers leave when the
    frames read together are flushed (raft/outbox.py), before the driver applies. (Applies run
    on the driver thread here, as a node's cheap LMDB applies do.)"""
    monkeypatch.setattr(pysyncobj_shard, "INLINE_APPLY_COST_S_MAX", 60.0)
    timings = dataclasses.replace(FAST, commit_notice_ms=20)
    async with running(tmp_path, timings=timings) as c:
        leader = await sole_leader(c)
        for k in range(5):
            await leader.propose(b"warm-%d" % k)
        await c.converged(WAIT_S)
        follower = followers(c, leader)[0]
        so = follower.syncobj
        assert so is not None
        events: list[tuple[str, int]] = []
        outbox = so.transport._outbox
        deliver = outbox._deliver

        def recording_deliver(node: object, message: object) -> bool:
            if isinstance(message, dict) and message.get("type") == "next_node_idx":
                events.append(("answered", int(message["next_node_idx"]) - 1))
            return bool(deliver(node, message))

        outbox._deliver = recording_deliver  # what leaves the node, after its flush
        sm = c.sms[follower.address]
        apply_batch = sm.apply_batch

        def recording_apply(entries: Sequence[Entry]) -> list[object]:
            for e in entries:
                events.append(("applied", frames.log_index_of(e.index)))
            return apply_batch(entries)

        sm.apply_batch = recording_apply  # type: ignore[method-assign]
        for k in range(ROUNDS):
            await leader.propose(b"round-%d" % k)
        await c.converged(WAIT_S)
        position = {event: i for i, event in enumerate(events)}
        applied = [index for kind, index in events if kind == "applied"]
        # For each applied entry k whose successor k + 1 was answered: which came first?
        answered_first = [
            position[("answered", k + 1)] < position[("applied", k)]
            for k in applied
            if ("answered", k + 1) in position
        ]
        assert len(answered_first) >= ROUNDS // 2, events
        assert sum(answered_first) >= 0.8 * len(answered_first), events
