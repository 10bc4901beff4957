"""Proposing a shard's commands: typed results, leadership, catch-up before a NOT_FOUND.

A command's refusal comes back from the apply as a ``FluxError`` result and is raised here; a
result of another type than the caller expects is a bug, caught right here, once, instead of an
``isinstance`` at every call site.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.errors import FieldViolation, FluxError
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.errors import domain_error
from raft import Shard, ShardError

if TYPE_CHECKING:
    from fluxmq.server.cluster_view import ClusterView

CATCH_UP_TIMEOUT_S = 2.0
LEADER_POLL_S = 0.02

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Advertised:
    """Where this node serves gRPC, and its Raft address in the shard."""

    grpc_address: str
    raft_address: str


def not_leader(detail: str, leader_grpc: str | None) -> FluxError:
    """NOT_LEADER naming the leader's gRPC address (ErrorInfo ``leader``; "" = not known yet),
    where a client can send the call instead: never a Raft address, which serves no gRPC."""
    return FluxError(
        "NOT_LEADER",
        detail
        + (f"; the leader serves gRPC at {leader_grpc}" if leader_grpc else "; retry shortly"),
        retriable=True,
        retry_after_ms=200,
        metadata={"leader": leader_grpc or ""},
    )


class Proposer:
    def __init__(
        self,
        shard: Shard,
        state: QueueStateMachine,
        *,
        advertised: Advertised | None,
        directory: ClusterView | None,
    ) -> None:
        self._shard = shard
        self._state = state
        self.advertised = advertised
        self._directory = directory

    @property
    def shard(self) -> Shard:
        return self._shard

    @property
    def shard_id(self) -> str:
        return self._shard.shard_id

    @property
    def is_leader(self) -> bool:
        return self._shard.is_leader

    async def submit(
        self,
        cmd: commands.Command,
        expect: type[T],
        timeout_ms: int | None = None,
        *,
        on_append: bool = False,
    ) -> T:
        """Propose ``cmd`` and return its result, which must be an ``expect``."""
        result = await self.propose(cmd, timeout_ms, on_append=on_append)
        if not isinstance(result, expect):
            raise AssertionError(f"{type(cmd).__name__} answered {type(result).__name__}")
        return result

    async def propose(
        self, cmd: commands.Command, timeout_ms: int | None = None, *, on_append: bool = False
    ) -> object:
        """Propose ``cmd``; its result as the shard gives it (refusals raised)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        try:
            result = await self._shard.propose(commands.encode(cmd), deadline, on_append=on_append)
        except Exception as exc:
            err = domain_error(exc)
            if err is None:
                raise
            if err.reason == "NOT_LEADER":  # the shard names a Raft address: name a gRPC one
                err = not_leader(
                    f"this node does not lead replication group {self.shard_id!r}",
                    self.leader_address(),
                )
            raise err from exc
        if isinstance(result, FluxError):
            raise result
        return result

    # -- leadership -------------------------------------------------------------------------

    def leader_address(self) -> str | None:
        """gRPC address of the shard's leader (None: no leader, or it has not recorded its
        address yet; a single node advertises none)."""
        if self._shard.is_leader:
            return self.advertised.grpc_address if self.advertised is not None else None
        leader = self._shard.leader
        if not leader:
            return None
        recorded = self._state.node_address(leader)
        if recorded is None and self._directory is not None:
            return self._directory.grpc_address_of(leader)  # a leader of an older version
        return recorded

    def require_leader(self) -> None:
        """For what only the leader can answer (heartbeats live in its memory)."""
        if not self._shard.is_leader:
            raise not_leader(
                "this node does not lead the queue's replication group"
                + ("" if self._shard.leader else "; no leader is elected yet"),
                self.leader_address(),
            )

    async def wait_for_leader(self, timeout_s: float) -> bool:
        """Until the shard knows a leader (bounded); -> whether it does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._shard.leader is None and not self._shard.is_leader:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(LEADER_POLL_S)
        return True

    async def catch_up(self) -> bool:
        """Before a lookup answers NOT_FOUND: apply everything committed before the call, so
        that it never denies what another node already acknowledged (read-your-writes across
        nodes). -> True: caught up, rerun the lookup; False: nothing to catch up (the shard's
        only replica holds the latest state).

        A leader catches up too: a new one may not have applied the entries its predecessor
        committed, and one cut off from its majority does not know it is deposed; the barrier
        (an empty entry through the log) settles both. When this replica cannot catch up (no
        leader known, or the barrier did not return within CATCH_UP_TIMEOUT_S) it raises a
        retriable GROUP_UNAVAILABLE: its own state may be stale, so NOT_FOUND would be a guess."""
        if len(self._shard.status().members) <= 1:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_TIMEOUT_S
        if not await self.wait_for_leader(CATCH_UP_TIMEOUT_S):
            raise self._not_caught_up("no leader is known to this replica")
        try:
            await asyncio.wait_for(self._shard.barrier(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise self._not_caught_up(
                f"it did not catch up with the leader within {CATCH_UP_TIMEOUT_S:g} s"
            ) from None
        except ShardError as exc:
            raise self._not_caught_up(f"its catch-up failed ({exc})") from exc
        return True

    def _not_caught_up(self, why: str) -> FluxError:
        shard_id = self.shard_id
        return FluxError(
            "GROUP_UNAVAILABLE",
            f"replication group {shard_id!r} cannot confirm its latest state on this node: "
            f"{why}; the answer is unknown here, retry",
            retriable=True,
            retry_after_ms=500,
            metadata={"group": shard_id},
        )

    # -- replication ------------------------------------------------------------------------

    def check_replication(self, config: pb.QueueConfig, prefix: str = "config") -> None:
        """The queue's replication must fit the shard it is placed on (this node's shard)."""
        replicas = len(self._shard.status().members)
        rep = config.replication
        if rep.factor and rep.factor != replicas:
            raise FluxError(
                "REPLICATION_UNSATISFIABLE",
                f"replication.factor {rep.factor} cannot be placed: this node's shard has "
                f"{replicas} replica(s) (0 means all of them)",
                violations=(
                    FieldViolation(f"{prefix}.replication.factor", f"must be 0 or {replicas}"),
                ),
            )
        if rep.min_in_sync > replicas:
            raise FluxError(
                "REPLICATION_UNSATISFIABLE",
                f"replication.min_in_sync {rep.min_in_sync} exceeds the shard's {replicas} "
                "replica(s)",
                violations=(
                    FieldViolation(f"{prefix}.replication.min_in_sync", f"at most {replicas}"),
                ),
            )

    def check_in_sync(self, min_in_sync: int) -> None:
        if not min_in_sync:
            return  # a majority: Raft's commit rule already waits for it
        in_sync = self._shard.status().in_sync
        if in_sync < min_in_sync:
            raise FluxError(
                "NOT_ENOUGH_REPLICAS",
                f"{in_sync} replica(s) in sync, the queue's replication.min_in_sync is "
                f"{min_in_sync}: nothing was written",
                retriable=True,
                retry_after_ms=500,
            )
