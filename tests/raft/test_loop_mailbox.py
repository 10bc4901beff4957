"""LoopMailbox (raft/loop_mailbox.py) and the driver's wake-ups: what a round hands to the event
loop arrives in one wake-up, in order; many wakers of the Raft driver write one byte per round;
and both shards hand an applied round's answers and the commit listener's calls over together."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from raft import Entry, LocalShard, pysyncobj_shard
from raft.driver import RaftDriver
from raft.loop_mailbox import LoopMailbox
from tests.raft.test_replication import running, sole_leader


async def test_posts_from_a_held_round_reach_the_loop_in_one_wakeup_in_order() -> None:
    mailbox = LoopMailbox(asyncio.get_running_loop())
    seen: list[int] = []

    def round_on_another_thread() -> None:
        mailbox.hold()
        for k in range(5):
            mailbox.post(seen.append, k)
        mailbox.release()

    thread = threading.Thread(target=round_on_another_thread)
    thread.start()
    thread.join()
    assert seen == [] and mailbox.wakeups == 1  # nothing runs until the loop takes it
    await asyncio.sleep(0)
    assert seen == [0, 1, 2, 3, 4] and mailbox.wakeups == 1


async def test_posts_without_a_hold_share_a_wakeup_until_the_loop_takes_them() -> None:
    mailbox = LoopMailbox(asyncio.get_running_loop())
    seen: list[str] = []
    mailbox.post(seen.append, "a")
    mailbox.post(seen.append, "b")
    assert mailbox.wakeups == 1
    await asyncio.sleep(0)
    assert seen == ["a", "b"]
    mailbox.post(seen.append, "c")  # after the loop ran them: a new wake-up
    assert mailbox.wakeups == 2
    await asyncio.sleep(0)
    assert seen == ["a", "b", "c"]


async def test_a_hold_released_on_the_loop_runs_the_calls_there_without_a_wakeup() -> None:
    mailbox = LoopMailbox(asyncio.get_running_loop())
    seen: list[int] = []
    mailbox.hold()
    await asyncio.get_running_loop().run_in_executor(None, mailbox.post, seen.append, 1)
    assert seen == []
    mailbox.release_here()
    assert seen == [1] and mailbox.wakeups == 0


async def test_a_failing_call_is_reported_and_the_calls_after_it_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        mailbox = LoopMailbox(loop)
        seen: list[int] = []

        def boom() -> None:
            raise RuntimeError("boom")

        mailbox.post(boom)
        mailbox.post(seen.append, 2)
        await asyncio.sleep(0)
        assert seen == [2]
        assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)
    finally:
        loop.set_exception_handler(None)


def test_many_wakers_of_the_raft_driver_write_one_wakeup_until_it_is_drained() -> None:
    driver = RaftDriver()  # not started: nothing drains the pipe but this test
    for _ in range(50):
        driver.wake()
    assert driver.wakeups == 1
    driver.poller.poll(0)  # the drain, as a round's poll would do it
    driver.wake()
    assert driver.wakeups == 2


class PostingMachine:
    """Posts to the loop from inside apply, as the queue state machine's commit listener does."""

    def __init__(self) -> None:
        self.shard: LocalShard | None = None
        self.applied = 0
        self.posted: list[int] = []

    def apply_batch(self, entries: Sequence[Entry]) -> list[object]:
        assert self.shard is not None
        for e in entries:
            self.shard.post_to_loop(self.posted.append, e.index)
        self.applied = entries[-1].index
        return [e.index for e in entries]

    def last_applied_index(self) -> int:
        return self.applied


async def test_a_local_shard_runs_what_apply_posts_before_answering_and_wakes_nothing() -> None:
    sm = PostingMachine()
    shard = LocalShard(sm)
    sm.shard = shard
    await shard.start()
    try:
        for k in range(1, 21):
            assert await shard.propose(b"x") == k
            assert sm.posted[-1] == k  # the listener's call ran before the answer
        assert shard.loop_wakeups == 0
    finally:
        await shard.close()


async def test_a_raft_shard_answers_each_applied_round_in_at_most_one_wakeup(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        posted: list[int] = []
        sm = c.sms[leader.address]
        original = sm.apply_batch

        def apply_batch(entries: Sequence[Entry]) -> list[object]:
            leader.post_to_loop(posted.extend, [e.index for e in entries])
            return original(entries)

        sm.apply_batch = apply_batch  # type: ignore[method-assign]
        wakeups_before, batches_before = leader.loop_wakeups, leader.batches_applied
        for k in range(30):
            await leader.propose(b"p%d" % k)
        assert len(posted) >= 30
        batches = leader.batches_applied - batches_before
        assert 0 < leader.loop_wakeups - wakeups_before <= batches


async def test_posts_reach_the_loop_while_a_failed_apply_waits_to_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mailbox is held only across an apply that succeeds: a state machine stalled on a
    full disk must not hold back what other parts post (refusals, other answers)."""
    monkeypatch.setattr(pysyncobj_shard, "APPLY_RETRY_S", 0.05)
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        sm = c.sms[leader.address]
        original = sm.apply_batch
        failures = [0]
        failing = threading.Event()
        failing.set()

        def apply_batch(entries: Sequence[Entry]) -> list[object]:
            if failing.is_set():
                failures[0] += 1
                raise OSError("no space left on device")
            return original(entries)

        sm.apply_batch = apply_batch  # type: ignore[method-assign]
        stalled = asyncio.ensure_future(leader.propose(b"stalls"))
        for _ in range(200):  # bounded: until the apply has failed twice
            if failures[0] >= 2:
                break
            await asyncio.sleep(0.01)
        assert failures[0] >= 2 and not stalled.done()
        seen: list[str] = []
        await asyncio.to_thread(leader.post_to_loop, seen.append, "posted")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == ["posted"] and not stalled.done()
        failing.clear()
        assert isinstance(await asyncio.wait_for(stalled, 10), int)
