"""The replication contract. A shard orders opaque byte commands into a log and applies them, in
order, to a state machine; ``propose`` resolves with what apply returned for that command.

raft/ knows nothing of queues: payloads and results are opaque to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    payload: bytes


class StateMachine(Protocol):
    def apply_batch(self, entries: Sequence[Entry]) -> list[object]:
        """Apply ``entries`` (increasing indexes, possibly with gaps) durably, in one
        transaction; one result per entry. Must skip entries at or below
        ``last_applied_index()`` (replays)."""
        ...

    def last_applied_index(self) -> int: ...

    def write_snapshot(self, path: str) -> int:
        """Write a consistent copy of the whole state to the new file ``path`` and fsync it;
        return the applied index the copy reflects. Streams: never the whole state in memory."""
        ...

    def install_snapshot(self, path: str) -> None:
        """Replace the whole state by the copy in ``path`` (written by ``write_snapshot`` on any
        replica), atomically: readers see the old state or the new one, never a mix."""
        ...


@dataclass(frozen=True, slots=True)
class ShardStatus:
    shard_id: str
    role: str  # "leader" | "follower" | "candidate"
    term: int
    commit_index: int
    applied_index: int
    members: tuple[str, ...]  # this replica's address first, then the others sorted
    leader: str | None
    pending_proposals: int
    # Replicas connected and caught up, this one included, as seen from this replica: on the
    # leader, followers within ``in_sync_lag_entries`` of the commit index; on a follower, the
    # peers it is connected to.
    in_sync: int = 1
    # This replica started without the Raft state it should have had (its disk was lost or it
    # is new) and is not a voter until it holds what the leader committed (raft/probation.py).
    on_probation: bool = False
    # Members this replica is connected to, and (on the leader) the members within
    # ``in_sync_lag_entries`` of the commit index, this replica included in both.
    connected: tuple[str, ...] = ()
    in_sync_members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Appended:
    """What ``propose(..., on_append=True)`` resolves with when the proposal was acknowledged at
    the leader's append (asynchronous replication): durable in the leader's log, not committed
    yet, not applied; a leader failure before replication may lose it."""


class ShardError(Exception):
    retriable = True


class NotLeaderError(ShardError):
    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ShardBusyError(ShardError):
    """Too many proposals waiting: back off and retry."""


class ShardClosedError(ShardError):
    pass


class ShardRequestDeniedError(ShardError):
    """The shard refused an administrative request (e.g. a transfer to a replica that is not
    caught up, or membership changes on a single-node shard). Retrying as is will not help."""

    retriable = False


class OutcomeUnknownError(ShardError):
    """The proposal reached the log but no result came back in time (deadline, leader change,
    shard closed): it may or may not be applied. Retry with the same idempotency key."""


class ProposalTimeoutError(ShardError):
    """The proposal's deadline passed before it was handed to the log: it was never applied."""


class Shard(Protocol):
    @property
    def shard_id(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader(self) -> str | None: ...

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        """Replicate and apply ``payload``; return apply's result. ``deadline`` is in the event
        loop's clock: a proposal still waiting for the log at its deadline is dropped (never
        applied) and raises ProposalTimeoutError. Once handed to the log it is waited for.
        ``on_append``: resolve with ``Appended`` as soon as the leader's log holds the proposal
        durably, before a majority does (where the implementation can tell; otherwise as
        usual, with apply's result)."""
        ...

    def status(self) -> ShardStatus: ...

    def post_to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the shard's event loop (from any thread; the state machine's
        commit listener calls it while applying). Calls posted during a round's apply reach
        the loop together with that round's answers, in one wake-up. Before ``start``
        nothing waits on the loop, and the call is dropped."""
        ...

    async def barrier(self) -> None:
        """Return once this replica has applied everything committed before the call."""
        ...

    async def transfer_leadership(self, target: str | None = None) -> str:
        """Hand leadership to ``target`` (None: the most caught-up member); return the target.
        Raises NotLeaderError on a follower, ShardRequestDeniedError when it cannot be done."""
        ...

    async def add_member(self, address: str) -> None:
        """Add a replica (committed through the log; one change at a time)."""
        ...

    async def remove_member(self, address: str) -> None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...
