"""LocalShard: the single-node shard (no network). The embedded default, and the model of what
the Raft shards promise: propose -> durable apply -> result.

Group commit: proposals that arrive while a batch is being applied wait in a queue; the next
batch takes all of them (bounded in count and bytes) into one ``apply_batch`` call, which the
state machine turns into one write transaction and one fsync. Apply runs on one worker thread so
the event loop keeps accepting requests during the fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from raft.api import (
    Entry,
    ProposalTimeoutError,
    ShardBusyError,
    ShardClosedError,
    ShardRequestDeniedError,
    ShardStatus,
    StateMachine,
)
from raft.loop_mailbox import LoopMailbox


@dataclass(slots=True)
class _Proposal:
    payload: bytes
    deadline: float | None
    future: asyncio.Future[object]
    timer: asyncio.TimerHandle | None = None


class LocalShard:
    def __init__(
        self,
        state_machine: StateMachine,
        *,
        shard_id: str = "local",
        batch_entries_max: int = 4096,
        batch_bytes_max: int = 16 * 1024 * 1024,
        pending_max: int = 20_000,
    ) -> None:
        assert batch_entries_max >= 1 and batch_bytes_max >= 1 and pending_max >= 1
        self._sm = state_machine
        self._shard_id = shard_id
        self._batch_entries_max = batch_entries_max
        self._batch_bytes_max = batch_bytes_max
        self._pending_max = pending_max
        self._pending: deque[_Proposal] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"apply-{shard_id}")
        self._task: asyncio.Task[None] | None = None
        self._mailbox: LoopMailbox | None = None  # set by start
        self._closed = False
        self._applied = state_machine.last_applied_index()
        self.batches_applied = 0
        self.entries_applied = 0

    @property
    def shard_id(self) -> str:
        return self._shard_id

    @property
    def is_leader(self) -> bool:
        return not self._closed

    @property
    def leader(self) -> str | None:
        return "local"

    def status(self) -> ShardStatus:
        return ShardStatus(
            shard_id=self._shard_id,
            role="leader",
            term=1,
            commit_index=self._applied,
            applied_index=self._applied,
            members=("local",),
            leader="local",
            pending_proposals=len(self._pending),
        )

    async def barrier(self) -> None:
        return None  # the only replica: everything committed is applied before it answers

    async def transfer_leadership(self, target: str | None = None) -> str:
        raise ShardRequestDeniedError("a single-node shard has no other member to lead")

    async def add_member(self, address: str) -> None:
        raise ShardRequestDeniedError(
            "a single-node shard cannot change membership: start the node in cluster mode"
        )

    async def remove_member(self, address: str) -> None:
        raise ShardRequestDeniedError(
            "a single-node shard cannot change membership: start the node in cluster mode"
        )

    def post_to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.post(fn, *args)

    @property
    def loop_wakeups(self) -> int:
        """Wake-ups of the event loop sent from the apply thread (none while it applies: what
        an apply posts runs when the loop takes its results)."""
        return 0 if self._mailbox is None else self._mailbox.wakeups

    async def start(self) -> None:
        if self._mailbox is None:
            self._mailbox = LoopMailbox(asyncio.get_running_loop())
        if self._task is None:
            self._task = asyncio.create_task(self._apply_routine(), name=f"{self._shard_id}-apply")

    async def close(self) -> None:
        """Stop taking proposals, finish the batch in flight, fail what still waits."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(ShardClosedError("shard closed before the proposal ran"))
        self._executor.shutdown(wait=True)

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        # One replica: its append is its commit, so on_append changes nothing.
        if self._closed:
            raise ShardClosedError("shard is closed")
        if len(self._pending) >= self._pending_max:
            raise ShardBusyError(f"{self._pending_max} proposals already waiting")
        loop = asyncio.get_running_loop()
        proposal = _Proposal(payload, deadline, loop.create_future())
        if deadline is not None:
            # Answer at the deadline even while a long batch is being applied ahead of us.
            proposal.timer = loop.call_at(deadline, self._expire, proposal)
        self._pending.append(proposal)
        self._wakeup.set()
        return await proposal.future

    @staticmethod
    def _expire(proposal: _Proposal) -> None:
        # Runs on the loop thread, like _take_batch: a proposal not yet taken is never applied.
        if not proposal.future.done():
            proposal.future.set_exception(ProposalTimeoutError("deadline passed before apply"))

    def _take_batch(self, now: float) -> list[_Proposal]:
        batch: list[_Proposal] = []
        size = 0
        while self._pending and len(batch) < self._batch_entries_max:
            p = self._pending[0]
            if batch and size + len(p.payload) > self._batch_bytes_max:
                break
            self._pending.popleft()
            if p.timer is not None:
                p.timer.cancel()  # taken: from here on the proposal is waited for
            if p.future.done():  # expired, or the caller went away: never applied
                continue
            if p.deadline is not None and now >= p.deadline:
                p.future.set_exception(ProposalTimeoutError("deadline passed before apply"))
                continue
            batch.append(p)
            size += len(p.payload)
        return batch

    async def _apply_routine(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._take_batch(loop.time())
            if not batch:
                continue
            try:
                results = await self._apply(batch)
            except Exception as exc:
                # Nothing of the batch was applied. Apply its proposals one by one, so that one
                # bad proposal (or a full disk hit by a big one) fails alone, not its neighbours.
                if len(batch) == 1:
                    self._fail(batch[0], exc)
                    continue
                for p in batch:
                    try:
                        self._resolve([p], await self._apply([p]))
                    except Exception as exc:
                        self._fail(p, exc)
                continue
            self._resolve(batch, results)

    async def _apply(self, batch: list[_Proposal]) -> list[object]:
        loop = asyncio.get_running_loop()
        first = self._applied + 1
        entries = [Entry(first + i, p.payload) for i, p in enumerate(batch)]
        mailbox = self._mailbox
        assert mailbox is not None, "started"
        # What the apply posts (the commit listener's wake-ups) runs here, once the results are
        # back on the loop: the executor's answer is the round's only wake-up.
        mailbox.hold()
        try:
            results = await loop.run_in_executor(self._executor, self._sm.apply_batch, entries)
        except Exception:
            self._applied = self._sm.last_applied_index()
            raise
        finally:
            mailbox.release_here()
        assert len(results) == len(batch)
        self._applied = entries[-1].index
        assert self._sm.last_applied_index() == self._applied
        self.batches_applied += 1
        self.entries_applied += len(batch)
        return results

    @staticmethod
    def _resolve(batch: list[_Proposal], results: list[object]) -> None:
        for p, result in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(result)

    @staticmethod
    def _fail(p: _Proposal, exc: BaseException) -> None:
        if not p.future.done():
            p.future.set_exception(exc)
