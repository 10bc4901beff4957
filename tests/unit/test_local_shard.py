"""LocalShard: group commit, deadlines, back-pressure, failure of a batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from raft import Entry, LocalShard, ProposalTimeoutError, ShardBusyError, ShardClosedError


class RecordingMachine:
    """A state machine that records each apply_batch call; ``gate`` holds the first one."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.applied = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = False
        self.poison = b"poison"  # a batch containing this payload fails as a whole

    def apply_batch(self, entries: Sequence[Entry]) -> list[object]:
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk on fire")
        if any(e.payload == self.poison for e in entries):
            raise ValueError("poisoned batch")
        self.batches.append([e.index for e in entries])
        self.applied = entries[-1].index
        return [e.payload.upper() for e in entries]

    def last_applied_index(self) -> int:
        return self.applied


async def test_proposals_arriving_together_share_one_apply_batch() -> None:
    sm = RecordingMachine()
    shard = LocalShard(sm)
    await shard.start()
    sm.gate.clear()  # the first batch blocks "in fsync" while more proposals arrive
    first = asyncio.ensure_future(shard.propose(b"a"))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(shard.propose(b"x%d" % i)) for i in range(10)]
    await asyncio.sleep(0.05)
    sm.gate.set()
    assert await first == b"A"
    assert await asyncio.gather(*rest) == [b"X%d" % i for i in range(10)]
    assert sm.batches == [[1], list(range(2, 12))]  # one transaction for the ten
    await shard.close()


async def test_proposal_past_its_deadline_is_never_applied() -> None:
    sm = RecordingMachine()
    shard = LocalShard(sm)
    await shard.start()
    sm.gate.clear()
    blocker = asyncio.ensure_future(shard.propose(b"slow"))
    await asyncio.sleep(0.02)
    loop = asyncio.get_running_loop()
    late = asyncio.ensure_future(shard.propose(b"late", deadline=loop.time() + 0.05))
    # Answered at its deadline although the batch ahead of it is still being applied.
    with pytest.raises(ProposalTimeoutError):
        await asyncio.wait_for(late, 1.0)
    sm.gate.set()
    await blocker
    await asyncio.sleep(0.05)
    assert sm.batches == [[1]]
    await shard.close()


async def test_too_many_waiting_proposals_are_refused_as_busy() -> None:
    sm = RecordingMachine()
    shard = LocalShard(sm, pending_max=3)
    await shard.start()
    sm.gate.clear()
    running = asyncio.ensure_future(shard.propose(b"0"))
    await asyncio.sleep(0.02)
    waiting = [asyncio.ensure_future(shard.propose(b"%d" % i)) for i in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(ShardBusyError):
        await shard.propose(b"one too many")
    sm.gate.set()
    await asyncio.gather(running, *waiting)
    await shard.close()


async def test_failed_batch_fails_its_proposals_and_the_shard_goes_on() -> None:
    sm = RecordingMachine()
    shard = LocalShard(sm)
    await shard.start()
    sm.fail_next = True
    with pytest.raises(OSError):
        await shard.propose(b"doomed")
    assert await shard.propose(b"next") == b"NEXT"
    assert sm.batches == [[1]]  # the failed batch did not consume an index
    await shard.close()
    with pytest.raises(ShardClosedError):
        await shard.propose(b"after close")


async def test_one_failing_proposal_does_not_fail_the_others_of_its_batch() -> None:
    sm = RecordingMachine()
    shard = LocalShard(sm)
    await shard.start()
    sm.gate.clear()
    first = asyncio.ensure_future(shard.propose(b"first"))  # holds the shard while others queue
    await asyncio.sleep(0.05)
    queued = [asyncio.ensure_future(shard.propose(p)) for p in (b"a", b"poison", b"b")]
    await asyncio.sleep(0.05)
    sm.gate.set()
    assert await first == b"FIRST"
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert results[0] == b"A" and results[2] == b"B"
    assert isinstance(results[1], ValueError)
    # The batch was retried one proposal at a time; the failure consumed no index.
    assert sm.batches == [[1], [2], [3]]
    await shard.close()
