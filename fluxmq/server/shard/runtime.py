"""ShardRuntime: one shard's parts on the event loop, built the same way for every shard a
node hosts (its first shard and those placement adds)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fluxmq.core import membership as msh
from fluxmq.core.delivery import Push
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.dead_letters import DeadLetters
from fluxmq.server.shard.delivery import GroupDelivery
from fluxmq.server.shard.membership import Members
from fluxmq.server.shard.proposer import Advertised, Proposer
from fluxmq.server.shard.queues import Queues
from fluxmq.server.shard.streams import Streams
from fluxmq.server.shard.timers import LeaderTimers
from fluxmq.server.shard.transact import Transactions
from fluxmq.server.shard.wakeups import Wakeups
from raft import Shard

if TYPE_CHECKING:
    from fluxmq.server.cluster_view import ClusterView

RETENTION_INTERVAL_MS_DEFAULT = 1000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ShardRuntime:
    """Owns a shard's parts; the shard (Raft or local) and its state machine come in built.

    The state machine's apply side reports each commit through ``commit_listener`` (from its
    own thread); the runtime posts that to the event loop as wake-ups, and what the apply
    assigned to checked-out consumers to their Consume streams, through the shard, which
    hands it over with the round's answers (one wake-up of the loop per round): the one channel
    from the apply side to the loop besides the published view."""

    def __init__(
        self,
        state: QueueStateMachine,
        shard: Shard,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        retention_interval_ms: int = RETENTION_INTERVAL_MS_DEFAULT,
        advertised: Advertised | None = None,
        directory: ClusterView | None = None,
    ) -> None:
        self.state = state
        self.shard = shard
        self.directory = directory
        self.now_ms = clock_ms
        self.reader = QueueReader(state)
        self.wakeups = Wakeups()
        self.proposer = Proposer(shard, state, advertised=advertised, directory=directory)
        sessions = msh.SessionTracker()
        self.queues = Queues(self.proposer, self.reader, clock_ms, directory)
        self.streams = Streams(self.reader, state.store, self.wakeups)
        self.delivery = GroupDelivery(self.proposer, self.reader, self.wakeups, clock_ms)
        self.transactions = Transactions(self.proposer, self.reader, clock_ms)
        self.members = Members(self.proposer, self.reader, sessions, clock_ms)
        self.dead_letters = DeadLetters(self.proposer, self.reader, clock_ms)
        self.timers = LeaderTimers(
            self.proposer,
            state,
            self.reader,
            sessions,
            self.dead_letters,
            clock_ms,
            retention_interval_ms=retention_interval_ms,
            live_sessions=self.delivery.live_sessions,
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id

    async def start(self) -> None:
        def on_commit(log_ids: list[int], group_ids: list[int], pushes: list[Push]) -> None:
            # Most rounds, above all on followers, have nobody waiting: no call to the loop.
            if self.wakeups.waiting:
                self.shard.post_to_loop(self.wakeups.committed, log_ids, group_ids)
            if pushes and self.delivery.streaming:
                self.shard.post_to_loop(self.delivery.pushed, pushes)

        self.state.commit_listener = on_commit
        await self.shard.start()
        self._tasks = self.timers.start()

    def drain(self) -> None:
        """The node is shutting down: the calls that wait for messages (long polls, Consume,
        Tail) end now with NODE_SHUTTING_DOWN, and new ones are refused; writes go on."""
        self.wakeups.drain()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.shard.close()
