"""What a replicated round costs in messages (raft/_pysyncobj.py hooks 8 and 9): the commit
index rides with the next append instead of an append of its own, so a follower handles one
message per round of a steady load, and pysyncobj's self-pipe is gone. Followers still learn
every commit (they converge) when no further append comes."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest

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
